package timeout_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/timeout"
)

var okResp any = &struct{}{}

// doneNext is a next that, like the engine's, watches ctx.Done.
func doneNext(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
	_ = ctx.Done()
	return okResp, nil
}

// serverCtx stands for the server's call context: a type the context
// package does not know, with a Done channel of its own.
type serverCtx struct {
	context.Context
	done chan struct{}
}

func (c serverCtx) Done() <-chan struct{} { return c.done }

// BenchmarkInvoke is one call through the filter with a trivial next:
// "pass" is the happy path of a call that has a deadline (or a method
// without one), "applies" one the filter gives a deadline.
func BenchmarkInvoke(b *testing.B) {
	f, err := timeout.Factory.Build(map[string]any{"default": "10s", "methods": map[string]any{"Cache.*": "50ms"}}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	withDeadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cancellable, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	// The floor under "applies": what context.WithTimeout and its cancel
	// cost alone, which a context with a deadline of its own needs (a
	// channel, a timer, the context) whoever makes it.
	b.Run("context.WithTimeout-alone", func(b *testing.B) {
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = doneNext(ctx, info, nil)
			cancel()
		}
	})
	for _, bc := range []struct {
		name   string
		filter bool
		ctx    context.Context
	}{
		{"without", false, withDeadline},
		{"pass", true, withDeadline},
		{"applies", true, context.Background()},
		{"applies-cancellable-parent", true, cancellable},
		{"applies-server-parent", true, serverCtx{context.Background(), make(chan struct{})}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if bc.filter {
					_, err = f.Invoke(bc.ctx, info, nil, doneNext)
				} else {
					_, err = doneNext(bc.ctx, info, nil)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
