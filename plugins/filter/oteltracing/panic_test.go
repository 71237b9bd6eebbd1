package oteltracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// A handler that panics is answered Internal by the engine, which
// recovers the panic above the chain: the server span of that call must
// still end (and so be exported), as an error, and so must a stream's.
func TestServerSpanEndsWhenHandlerPanics(t *testing.T) {
	spans.Reset()
	cfg := config(t, "b", "  - {name: otel-tracing, side: server}\n")
	srv := serve(t, cfg, "B.Call", func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		panic("handler bug")
	})
	_ = srv
	cli, err := kernrpc.NewClient(config(t, "b", "  - {name: otel-tracing, side: client}\n"), "b")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var resp wrapperspb.StringValue
	err = cli.Call(context.Background(), "B.Call", wrapperspb.String("x"), &resp)
	if kernel.CodeOf(err) != kernel.Internal {
		t.Fatalf("call: %v; want Internal", err)
	}
	var server, client int
	for _, s := range spans.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindServer:
			server++
			if s.Status.Code != codes.Error {
				t.Errorf("server span %q: status %v; want Error", s.Name, s.Status)
			}
		case trace.SpanKindClient:
			client++
		}
	}
	if client != 1 || server != 1 {
		t.Errorf("%d client and %d server spans ended; want 1 and 1", client, server)
	}
}

func TestServerStreamSpanEndsWhenHandlerPanics(t *testing.T) {
	spans.Reset()
	cfg := config(t, "chat", "  - {name: otel-tracing, side: server}\n")
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.HandleBidiStream(srv, "Chat.Echo", func(ctx context.Context, st chatStream) error {
		panic("stream handler bug")
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	cli, err := kernrpc.NewClient(config(t, "chat", ""), "chat")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := chat(context.Background(), cli, "x"); kernel.CodeOf(err) != kernel.Internal {
		t.Fatalf("stream: %v; want Internal", err)
	}
	stubs := spans.GetSpans()
	if len(stubs) != 1 || stubs[0].SpanKind != trace.SpanKindServer || stubs[0].Status.Code != codes.Error {
		t.Errorf("spans ended: %v; want the server's, with status Error", names(stubs))
	}
}
