package kernrpc_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/hedge"
	"github.com/kernrpc/kernrpc/plugins/filter/retry"
)

// A client's retry and hedge filters spend from one budget: the first
// one's in config order, whichever that is.
func TestRetryAndHedgeShareOneBudget(t *testing.T) {
	for _, order := range [][]string{{retry.Name, hedge.Name}, {hedge.Name, retry.Name}} {
		t.Run(order[0]+" first", func(t *testing.T) {
			cfg := testConfig(t)
			for _, name := range order {
				cfg.Filters = append(cfg.Filters, kernrpc.FilterConfig{Name: name, Side: "client"})
			}
			cli := newClient(t, cfg)
			r, _ := kernrpc.FindPlugin[*retry.Filter](cli.Plugins(), retry.Name)
			h, _ := kernrpc.FindPlugin[*hedge.Filter](cli.Plugins(), hedge.Name)
			if r == nil || h == nil {
				t.Fatalf("built retry %v, hedge %v", r, h)
			}
			full := r.Tokens()
			var first kernel.AttemptBudgetOwner = r
			if order[0] == hedge.Name {
				first = h
			}
			for range 3 {
				first.AttemptBudget().Failed()
			}
			// Within the refill of a few milliseconds (1 token/s).
			if rt, ht := r.Tokens(), h.Tokens(); math.Abs(rt-(full-3)) > 0.1 || math.Abs(ht-(full-3)) > 0.1 {
				t.Errorf("after 3 failures charged to the first filter's budget: retry holds %v, hedge %v; want both %v", rt, ht, full-3)
			}
		})
	}
	// Without a retry filter, the hedge keeps its own.
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: hedge.Name, Side: "client"}}
	h, _ := kernrpc.FindPlugin[*hedge.Filter](newClient(t, cfg).Plugins(), hedge.Name)
	h.AttemptBudget().Failed()
	if h.Tokens() > 9.1 {
		t.Errorf("a lone hedge's budget holds %v after a failure; want it charged", h.Tokens())
	}
}

// On a method both serve, one of them runs in the other's calls of next,
// through the engine: a failed attempt still costs the one budget one
// token, not one for each filter that sees it, and a success gives back
// one refund.
func TestRetryAndHedgeStackedChargeAFailureOnce(t *testing.T) {
	for _, order := range [][]string{{retry.Name, hedge.Name}, {hedge.Name, retry.Name}} {
		t.Run(order[0]+" first", func(t *testing.T) {
			cfg := testConfig(t)
			var failed atomic.Bool
			startNamed(t, cfg, "flaky", func(context.Context) (*echopb.Echo, error) {
				if failed.CompareAndSwap(false, true) {
					return nil, kernel.Errorf(kernel.Unavailable, "once")
				}
				return &echopb.Echo{Text: "ok"}, nil
			})
			for _, name := range order {
				opts := map[string]any{"backoff": "1ms", "max_backoff": "1ms"} // retry's
				if name == hedge.Name {
					opts = map[string]any{"delay": "1h"}
				}
				cfg.Filters = append(cfg.Filters, kernrpc.FilterConfig{Name: name, Side: "client", Options: opts})
			}
			cli := newClient(t, cfg)
			r, _ := kernrpc.FindPlugin[*retry.Filter](cli.Plugins(), retry.Name)
			before := r.Tokens()
			var resp echopb.Echo
			if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil || resp.Text != "ok" {
				t.Fatalf("%v, reply %q; want the second attempt's answer", err, resp.Text)
			}
			// One failure (−1) and one success (+0.1), within the refill
			// of a few milliseconds (1 token/s).
			if got, want := r.Tokens(), before-1+0.1; math.Abs(got-want) > 0.05 {
				t.Errorf("the budget went from %v to %v tokens for one failed attempt and a success; want %v", before, got, want)
			}
		})
	}
}
