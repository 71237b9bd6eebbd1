package plugintest

import (
	"context"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterDeadliner holds a kernel.Deadliner to what the kernel asks of it
// beside the engine: CallTimeout returns without blocking, and Invoke,
// given a call whose ctx has no deadline, calls next with the deadline
// CallTimeout names, or an earlier one. The engine gives that deadline
// itself, before any filter runs; outside it (a chain of the user's own,
// a test) Invoke is all there is. Skipped for a filter that is no
// Deadliner, or whose CallTimeout gives the suite's method none.
func filterDeadliner(t tb, e *filterEnv) {
	dl, ok := e.filter.(kernel.Deadliner)
	if !ok {
		t.Skipf("the filter does not implement kernel.Deadliner")
	}
	info := e.info()
	answer := make(chan time.Duration, 1)
	go func() { answer <- dl.CallTimeout(info) }()
	var d time.Duration
	select {
	case d = <-answer:
	case <-time.After(e.patience()):
		t.Fatalf("CallTimeout on the %s side did not return within %s; the engine asks it as every call starts: it must be quick and must not block",
			e.side, e.patience())
	}
	if d <= 0 {
		t.Skipf("CallTimeout gives the suite's method %s no deadline (%s); configure FilterConfig.Options so that it gives one, "+
			"to have Invoke's own deadline checked", info.Method, d)
	}
	ctx := t.Context()
	if _, has := ctx.Deadline(); has {
		t.Fatalf("plugintest: the test's context has a deadline; the check needs one without")
	}
	var mu sync.Mutex
	var got time.Time
	var had bool
	var bound time.Time
	next := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		if !had {
			got, had = ctx.Deadline()
			bound = time.Now().Add(d)
		}
		return &filterResp{id: "deadliner"}, nil
	}
	if _, ok := e.passingCall(t, e.info(), next); !ok {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case !had:
		t.Errorf("the filter is a kernel.Deadliner whose CallTimeout gives %s a deadline of %s, but its Invoke, given a ctx with "+
			"no deadline, called next without one; outside the engine (a chain of one's own, a test) Invoke is what gives it: "+
			"wrap ctx in context.WithTimeout when it has no deadline", info.Method, d)
	case got.After(bound):
		t.Errorf("the filter is a kernel.Deadliner whose CallTimeout gives %s a deadline of %s, but its Invoke, given a ctx with "+
			"no deadline, called next with one %s later than that", info.Method, d, got.Sub(bound).Round(time.Millisecond))
	}
}
