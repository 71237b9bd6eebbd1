package kernrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
)

// A call that waits for its server: the client knows the server only by
// its address, and the server starts a moment after the call is made (as
// one restarting in place would come back). Without WaitForReady the call
// would fail at once with Unavailable, its dial refused.
func ExampleWaitForReady() {
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()

	cfg, err := kernrpc.ParseConfig([]byte(`
service: greeter
address: `+addr+`
registry: {name: memory, options: {namespace: wait-for-ready, static: {greeter: ["`+addr+`"]}}}
`), "kernrpc.yaml")
	if err != nil {
		log.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, "greeter")
	if err != nil {
		log.Fatal(err)
	}

	started := make(chan *kernrpc.Server, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		srv, err := kernrpc.NewServer(cfg)
		if err != nil {
			log.Fatal(err)
		}
		kernrpc.Handle(srv, "Greeter.Hello", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String("hello, " + req.GetValue()), nil
		})
		if err := srv.Start(context.Background()); err != nil {
			log.Fatal(err)
		}
		started <- srv
	}()

	var resp wrapperspb.StringValue
	err = cli.Call(context.Background(), "Greeter.Hello", wrapperspb.String("patient caller"), &resp,
		kernrpc.WaitForReady(true), kernrpc.CallTimeout(2*time.Second))
	fmt.Println(resp.GetValue(), err)
	srv := <-started
	cli.Close()
	srv.Shutdown(context.Background())
	// Output: hello, patient caller <nil>
}
