package kernrpc_test

import (
	"math"
	"testing"

	"github.com/kernrpc/kernrpc"
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
