package kernrpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
)

// A server-streaming method: one request in, messages out until the
// handler returns; the client reads until io.EOF.
func ExampleHandleServerStream() {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "countdown"
	cfg.Registry.Options = map[string]any{"namespace": "example-stream"}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	kernrpc.HandleServerStream(srv, "Countdown.From", func(ctx context.Context, req *wrapperspb.Int32Value, st kernrpc.ServerStreamOf[wrapperspb.Int32Value, wrapperspb.Int32Value]) error {
		for n := req.Value; n > 0; n-- {
			if err := st.Send(wrapperspb.Int32(n)); err != nil {
				return err // the client went away, or the stream's deadline passed
			}
		}
		return nil
	})
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	cli, err := kernrpc.NewClient(cfg, "countdown")
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	st, err := kernrpc.OpenServerStream[wrapperspb.Int32Value, wrapperspb.Int32Value](ctx, cli, "Countdown.From", wrapperspb.Int32(3))
	if err != nil {
		log.Fatal(err)
	}
	for {
		n, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(n.Value)
	}
	// Output:
	// 3
	// 2
	// 1
}
