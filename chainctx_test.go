package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// sloppyTimeout derives a deadline from the call's context and cancels it
// only well after the call, as a careless filter might: its timer runs
// after the call has returned.
type sloppyTimeout struct{}

func (sloppyTimeout) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	time.AfterFunc(100*time.Millisecond, cancel)
	return next(tctx, info, req)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-sloppy-timeout", New: func(any) (kernel.Filter, error) { return sloppyTimeout{}, nil }})
}

// A context a filter derived from the call's may outlive the call: its
// timer fires, and asks its parent for Done, while the engine has already
// reused its call state for later calls. That must neither crash nor
// race (the engine once handed filters its pooled call state itself).
func TestContextsFiltersDeriveMayOutliveTheCall(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-sloppy-timeout", Side: "client"}}
	startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithCancel(context.Background()) // a parent that can be cancelled, so children register with it
	defer cancel()
	deadline := time.Now().Add(300 * time.Millisecond)
	answered := 0
	for n := 0; time.Now().Before(deadline); n++ {
		var out echopb.Echo
		err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "x"}, &out)
		switch {
		case err == nil:
			answered++
		case kernel.CodeOf(err) == kernel.DeadlineExceeded, kernel.CodeOf(err) == kernel.Canceled:
			// The filter's own 20 ms passed: a loaded machine (the whole
			// suite under -race) can take that long for a call, and the
			// timer then fires during the call, which is as it should be.
			// Past 100 ms its cancel fires too, and runs on a goroutine of
			// its own as the timeout's does: a starved machine may run
			// the cancel first (seen beside a fuzzing run).
		default:
			t.Fatalf("call %d: %v", n, err)
		}
	}
	if answered == 0 {
		t.Fatal("no call was answered within the filter's 20 ms: the timers never outlived a call")
	}
	time.Sleep(150 * time.Millisecond) // the last timers fire
}
