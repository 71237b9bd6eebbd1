package echopb_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/examples/echo/echopb"
)

// echoServer implements echopb.EchoServiceServer.
type echoServer struct{}

func (echoServer) Say(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
	return req, nil
}

// The README's quick start, with its config inline: a server of the
// generated interface and the generated client, in each call model.
func Example() {
	cfg, err := kernrpc.ParseConfig([]byte(`
service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: echopb-example}}
client: {timeout: 2s}
`), "kernrpc.yaml")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	echopb.RegisterEchoServiceServer(srv, echoServer{})
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)

	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	echo := echopb.NewEchoServiceClient(cli)

	resp, err := echo.Say(ctx, &echopb.Echo{Text: "sync"}) // synchronous
	if err != nil {
		log.Fatal(err)
	}
	call := <-echo.SayAsync(ctx, &echopb.Echo{Text: "async"}, nil).Done // asynchronous
	done := make(chan struct{})
	echo.SayFunc(ctx, &echopb.Echo{Text: "callback"}, func(r *echopb.Echo, err error) { // callback
		fmt.Println(r.GetText(), err)
		close(done)
	})
	<-done
	fmt.Println(resp.GetText(), call.Response.(*echopb.Echo).GetText(), call.Err)
	// Output:
	// callback <nil>
	// sync async <nil>
}
