package faultharness_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// Found by the harness: a server drained with no deadline (the README's
// defer srv.Shutdown(ctx)) whose client kept two idle connections open
// never finished while closeConns shared one grace timer among all the
// connections: its channel fires once, so the second connection waited
// for a client that, reading nothing, never notices the half-close.
func TestShutdownWithoutDeadlineEndsWhileIdleClientsKeepTheirConns(t *testing.T) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "harness"
	cfg.Registry.Options = map[string]any{"namespace": "faultharness/" + t.Name()}
	cfg.Client.PoolSize = 2
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, method, func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return req, nil
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i := range 8 { // over both connections of the pool
		ctx, cancel := context.WithTimeout(kernrpc.WithMetadata(context.Background(), kernel.Metadata{idKey: "x"}), 2*time.Second)
		err := cli.Call(ctx, method, wrapperspb.String("hi"), new(wrapperspb.StringValue))
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(5 * time.Second): // closeGrace is 1s
		cli.Close() // lets the shutdown end, so that the test leaks nothing
		<-done
		t.Fatal("Shutdown without a deadline still runs 5s after it began, with the client's two connections idle; each should get closeGrace (1s)")
	}
}
