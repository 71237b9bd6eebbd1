package kernrpc_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// A service and a client composed from one config, on the defaults the
// engine builds in (tcp-lv, protobuf, memory, round-robin): no plugin
// import is needed for them.
func Example() {
	cfg, err := kernrpc.ParseConfig([]byte(`
service: greeter
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: example}}
client: {timeout: 2s}
`), "kernrpc.yaml")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	kernrpc.Handle(srv, "Greeter.Hello", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("hello, " + req.GetValue()), nil
	})
	ctx := context.Background()
	// Start listens and registers, then returns; Serve(ctx) would block
	// until ctx ends and then shut down gracefully.
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)

	cli, err := kernrpc.NewClient(cfg, "greeter")
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	var resp wrapperspb.StringValue
	if err := cli.Call(ctx, "Greeter.Hello", wrapperspb.String("sync"), &resp); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.GetValue())

	var goResp wrapperspb.StringValue
	call := cli.Go(ctx, "Greeter.Hello", wrapperspb.String("async"), &goResp, nil)
	<-call.Done
	fmt.Println(goResp.GetValue(), call.Err)

	done := make(chan string, 1)
	var fnResp wrapperspb.StringValue
	cli.CallFunc(ctx, "Greeter.Hello", wrapperspb.String("callback"), &fnResp, func(c *kernrpc.Call) {
		done <- fnResp.GetValue()
	})
	fmt.Println(<-done)
	// Output:
	// hello, sync
	// hello, async <nil>
	// hello, callback
}

// A filter built from config can be reached from code, by name and type.
func ExampleFindPlugin() {
	cfg, err := kernrpc.ParseConfig([]byte("service: counted\nfilters: [example-counter]\n"), "kernrpc.yaml")
	if err != nil {
		log.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, "")
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	counter, ok := kernrpc.FindPlugin[*exampleCounter](cli.Plugins(), "example-counter")
	fmt.Println(ok, counter.calls)
	// Output: true 0
}

type exampleCounter struct{ calls int }

func (c *exampleCounter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	c.calls++
	return next(ctx, info, req)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "example-counter", New: func(any) (kernel.Filter, error) {
		return &exampleCounter{}, nil
	}})
}
