package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/hedge"
	"github.com/kernrpc/kernrpc/plugins/filter/retry"
)

// A retry and a hedge filter on one method spend from one budget, and a
// failed attempt costs it one token, a successful call gives back one
// refund, whichever of the two runs in the other, and whether the hedge
// is armed (a fixed delay, here too long to fire) or not (an observed
// one, for a method too cold to have it).
func TestStackedWithHedgeChargesAFailureOnce(t *testing.T) {
	for _, hedgeFirst := range []bool{false, true} {
		for _, delay := range []time.Duration{0, time.Hour} {
			name := "retry first"
			if hedgeFirst {
				name = "hedge first"
			}
			t.Run(name+"/delay="+delay.String(), func(t *testing.T) {
				r := build(t, nil)
				ho := hedge.DefaultOptions()
				ho.Delay = kernel.Duration(delay)
				hf, err := hedge.New(ho)
				if err != nil {
					t.Fatal(err)
				}
				h := hf.(*hedge.Filter)
				t.Cleanup(func() { h.Close() })
				refs := []kernel.PluginRef{
					{Kind: kernel.KindFilter, Name: retry.Name, Side: kernel.ClientSide, Plugin: r},
					{Kind: kernel.KindFilter, Name: hedge.Name, Side: kernel.ClientSide, Plugin: h},
				}
				if hedgeFirst {
					refs[0], refs[1] = refs[1], refs[0]
				}
				r.ObservePlugins(refs)
				h.ObservePlugins(refs)

				// Unavailable, then a success: the retry's second call of
				// next, or the hedge's next attempt, at once.
				s := &script{errs: []error{unavailable}}
				outer := func(ctx context.Context, info *kernel.CallInfo) (any, error) {
					return r.Invoke(ctx, info, "req", func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
						return h.Invoke(ctx, info, req, s.next)
					})
				}
				if hedgeFirst {
					outer = func(ctx context.Context, info *kernel.CallInfo) (any, error) {
						return h.Invoke(ctx, info, "req", func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
							return r.Invoke(ctx, info, req, s.next)
						})
					}
				}
				before := r.Tokens()
				info := &kernel.CallInfo{Method: "Echo.Echo", Side: kernel.ClientSide}
				if _, err := outer(t.Context(), info); err != nil || s.calls != 2 {
					t.Fatalf("got %v after %d attempts; want a success after 2", err, s.calls)
				}
				// One failure (−1) and one successful call (+0.1).
				if got, want := r.Tokens(), before-1+0.1; got < want-0.01 || got > want+0.01 {
					t.Errorf("the budget went from %v to %v tokens for one failed attempt and one success; want %v", before, got, want)
				}

				// A call that fails for good: each failed attempt is
				// charged once.
				s = &script{errs: []error{unavailable, unavailable, unavailable, unavailable, unavailable, unavailable}}
				before = r.Tokens()
				if _, err := outer(t.Context(), info); err != unavailable {
					t.Fatalf("got %v, want %v", err, unavailable)
				}
				if got, want := r.Tokens(), before-float64(s.calls); got < want-0.01 || got > want+0.01 {
					t.Errorf("the budget went from %v to %v tokens for %d failed attempts; want %v", before, got, s.calls, want)
				}
			})
		}
	}
}
