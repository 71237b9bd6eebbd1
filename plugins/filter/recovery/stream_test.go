package recovery_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/echostream"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/recovery"
)

// panicStream is a stream filter that panics when the stream's metadata
// asks it to: a client stream filter runs on a goroutine of its own,
// where nothing else recovers.
type panicStream struct{ kernel.FilterFunc }

func (panicStream) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if info.Metadata["panic"] == "yes" {
		panic("client stream filter bug")
	}
	return next(ctx, info, st)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-panic-stream", New: func(any) (kernel.Filter, error) {
		return panicStream{func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(ctx, info, req)
		}}, nil
	}})
}

// The filter recovers streams as it does calls: a panic in the rest of a
// stream's chain ends the stream with Internal, logged, instead of taking
// the program down (on the client, where the chain runs on a goroutine
// of its own that nothing else recovers).
func TestStreamPanicBecomesInternal(t *testing.T) {
	var out enginetest.LogBuffer
	flt, _ := recovery.New(&recovery.Options{Stack: false, Logger: slog.New(slog.NewTextHandler(&out, nil))})
	f, ok := flt.(kernel.StreamFilter)
	if !ok {
		t.Fatal("the filter is not a kernel.StreamFilter: a panicking client stream filter after it takes the program down")
	}
	info := &kernel.CallInfo{Method: "Chat.Talk", Side: kernel.ClientSide, Peer: "10.0.0.1:7000"}
	err := f.InvokeStream(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, kernel.Stream) error {
		panic("stream bug")
	})
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "recover: Chat.Talk panicked on the client side: stream bug") {
		t.Errorf("%v; want Internal saying what panicked", err)
	}
	for _, want := range []string{"level=ERROR", "method=Chat.Talk", "side=client", "stream bug"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the log line does not say %q: %s", want, out.String())
		}
	}
	want := kernel.Errorf(kernel.Unavailable, "fine")
	if err := f.InvokeStream(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, kernel.Stream) error { return want }); err != want {
		t.Errorf("next's error came back as %v", err)
	}

	// Over the engine: the client's stream fails to open, and the client
	// goes on.
	cfg := testConfig(t)
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.HandleBidiStream(srv, "Watch.Echo", echostream.Serve[echopb.Echo])
	})
	cli := enginetest.Dial(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: recovery.Name, Side: "client", Options: map[string]any{"stack": false}},
		kernrpc.FilterConfig{Name: "test-panic-stream", Side: "client"}))
	ctx := kernrpc.WithMetadata(t.Context(), kernel.Metadata{"panic": "yes"})
	if _, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Watch.Echo"); kernel.CodeOf(err) != kernel.Internal {
		t.Errorf("a client stream filter's panic: %v; want Internal from the recover filter", err)
	}
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](t.Context(), cli, "Watch.Echo")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.Text != "hi" {
		t.Errorf("the next stream: %v, %v", m, err)
	}
	_ = st.CloseSend()
}
