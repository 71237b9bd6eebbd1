package kernrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

func init() {
	// test-stamp adds one request metadata entry, as the auth filter's
	// client side and the tracing filter do, in the stage its options say.
	kernel.RegisterFilter(kernel.NewFactory("test-stamp", "test: stamps one request metadata entry",
		func() *stampOptions { return &stampOptions{} },
		func(o *stampOptions) (kernel.Filter, error) { return &stampFilter{opts: *o}, nil }))
}

type stampOptions struct {
	Attempt bool `json:"attempt"` // run in the attempt stage
}

type stampFilter struct{ opts stampOptions }

func (f *stampFilter) Stage() kernel.Stage {
	if f.opts.Attempt {
		return kernel.AttemptStage
	}
	return kernel.CallStage
}

func (f *stampFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	info.SetRequestMetadata("x-stamp", "stamped")
	return next(ctx, info, req)
}

// A filter adding request metadata adds it to the call's own copy: the map
// the caller attached, even an empty one, is left as it was, and calls
// sharing it run without a race.
func TestFiltersNeverWriteIntoTheCallersMetadata(t *testing.T) {
	for _, stage := range []string{"call", "attempt"} {
		t.Run(stage, func(t *testing.T) {
			cfg := testConfig(t)
			got := make(chan kernel.Metadata, 16)
			startServer(t, cfg, func(s *kernrpc.Server) {
				kernrpc.Handle(s, "Echo.MD", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
					got <- kernrpc.IncomingMetadata(ctx)
					return req, nil
				})
			})
			cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-stamp", Side: "client",
				Options: map[string]any{"attempt": stage == "attempt"}}))
			md := kernel.Metadata{} // built empty, as a caller with nothing to add this time does
			ctx, cancel := context.WithTimeout(kernrpc.WithMetadata(context.Background(), md), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					var resp echopb.Echo
					if err := cli.Call(ctx, "Echo.MD", &echopb.Echo{Text: "x"}, &resp); err != nil {
						t.Errorf("call: %v", err)
					}
				})
			}
			wg.Wait()
			for range 4 {
				if m := receive(t, got, 10*time.Second, "the handler got no call"); m["x-stamp"] != "stamped" {
					t.Errorf("server got %v; want the filter's x-stamp", m)
				}
			}
			if len(md) != 0 {
				t.Errorf("the caller's metadata map became %v; a filter's entries belong to the call, not to the map the caller attached", md)
			}
		})
	}
}
