package oteltracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// copyInfoOptions are the options of the test's copy-info filter: none.
type copyInfoOptions struct{}

// copyInfo passes on a copy of the CallInfo it is given, as the kernel
// allows ("It is plain data: a filter may copy it and pass the copy on").
func init() {
	kernel.RegisterFilter(kernel.NewFactory("test-copy-info", "passes a copy of the CallInfo on",
		func() *copyInfoOptions { return &copyInfoOptions{} },
		func(*copyInfoOptions) (kernel.Filter, error) {
			return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
				ci := *info
				return next(ctx, &ci, req)
			}), nil
		}))
}

// A server filter ahead of otel-tracing that passes a copy of the
// CallInfo on must not keep the server span from ending: the engine tells
// CallEnded of its own CallInfo, not of the copy.
func TestServerSpanEndsBehindAFilterThatCopiesCallInfo(t *testing.T) {
	spans.Reset()
	cfg := config(t, "b", "  - {name: test-copy-info, side: server}\n  - {name: otel-tracing, side: server}\n")
	serve(t, cfg, "B.Call", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return req, nil
	})
	cli, err := kernrpc.NewClient(config(t, "b", "  - {name: otel-tracing, side: client}\n"), "b")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Call(context.Background(), "B.Call", wrapperspb.String("hi"), new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	stubs := waitSpans(t, 2)
	var server int
	for i, s := range stubs {
		if s.SpanKind != trace.SpanKindServer {
			continue
		}
		server++
		// Ended by CallEnded, once the answer was sent: with its size.
		if got := attrs(stubs.Snapshots()[i])["rpc.kernrpc.response.size"].AsInt64(); got != 4 {
			t.Errorf("server span: rpc.kernrpc.response.size %d, want 4", got)
		}
	}
	if server != 1 {
		t.Errorf("%d server spans ended, want 1: %v", server, names(stubs))
	}
}
