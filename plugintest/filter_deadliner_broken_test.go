package plugintest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterDeadline is a kernel.Deadliner that gives every call d; give
// is how its Invoke passes the call on, with ctx as it came.
type filterDeadline struct {
	d    time.Duration
	give func(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

func (f filterDeadline) CallTimeout(*kernel.CallInfo) time.Duration { return f.d }

func (f filterDeadline) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if _, ok := ctx.Deadline(); ok {
		return next(ctx, info, req)
	}
	ctx, cancel := f.give(ctx, f.d)
	defer cancel()
	return next(ctx, info, req)
}

func filterDeadlineFactory(f filterDeadline) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{Name: "deadline", New: func(any) (kernel.Filter, error) { return f, nil }}
}

// TestFilterChecksDeadliners: a Deadliner that gives its deadline in
// Invoke passes; one that leaves it to the engine, or gives a later one
// than CallTimeout says, is caught by Filter/Deadliner, and passed every
// other check before it.
func TestFilterChecksDeadliners(t *testing.T) {
	t.Run("gives it", func(t *testing.T) {
		rec := filterRecord(t, filterDeadlineFactory(filterDeadline{time.Second, context.WithTimeout}), FilterConfig{})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Deadliner"); why != "" {
			t.Errorf("Filter/Deadliner skipped for a Deadliner: %s", why)
		}
	})
	t.Run("no deadline for the method", func(t *testing.T) {
		rec := filterRecord(t, filterDeadlineFactory(filterDeadline{0, context.WithTimeout}), FilterConfig{})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Deadliner"); why == "" {
			t.Errorf("Filter/Deadliner ran for a Deadliner that gives the suite's method no deadline; want it skipped, saying so")
		}
	})
	cases := []struct {
		name string
		give func(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
		says string
	}{
		// The engine gives the deadline CallTimeout names; Invoke trusts
		// it to, and outside the engine calls run unbounded.
		{"leaves the deadline to the engine", func(ctx context.Context, _ time.Duration) (context.Context, context.CancelFunc) {
			return ctx, func() {}
		}, "called next without one"},
		// CallTimeout and Invoke disagree: a table of timeouts read in two
		// places, one of them out of date.
		{"gives a later deadline than CallTimeout", func(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 10*d)
		}, "later than that"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, filterDeadlineFactory(filterDeadline{time.Second, tc.give}), FilterConfig{})
			expectCaught(t, rec, "Filter/Deadliner")
			expectMessage(t, rec, "Filter/Deadliner", tc.says)
			for _, f := range rec.failures {
				if f.path != "Filter/Deadliner" && !strings.HasPrefix(f.path, "Filter/Deadliner/") {
					t.Errorf("the broken Deadliner failed %s too, which it should pass: %s", f.path, f.msg)
				}
			}
		})
	}
}
