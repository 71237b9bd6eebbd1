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
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-leave-attempt", New: func(any) (kernel.Filter, error) { return detach{detachedEnded}, nil }})
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

// detach answers Echo.Detached with a fallback after 100 ms, leaving the
// attempt it started running on the call's own context (which the engine
// keeps alive for it), and reports when that attempt returns.
type detach struct{ ended chan error }

func (d detach) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Method != "Echo.Detached" {
		return next(ctx, info, req)
	}
	go func() {
		_, err := next(ctx, info, req)
		d.ended <- err
	}()
	time.Sleep(100 * time.Millisecond) // the attempt is sent and waits
	return &echopb.Echo{Text: "fallback"}, nil
}

var detachedEnded = make(chan error, 1)

// An attempt a filter leaves running on the call's context after the
// call returned ends with that context: at the latest at the deadline the
// client gave the call in place (client.timeout), as it would under a
// context.WithTimeout, even while another caller holds the reader role
// and its server does not answer.
func TestAttemptLeftRunningEndsWithItsContext(t *testing.T) {
	for _, cancelable := range []bool{false, true} {
		name := "background"
		if cancelable {
			name = "cancelable"
		}
		t.Run(name, func(t *testing.T) { attemptLeftRunning(t, cancelable) })
	}
}

func attemptLeftRunning(t *testing.T, cancelable bool) {
	cfg := testConfig(t)
	cfg.Client.Timeout = kernel.Duration(300 * time.Millisecond)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-leave-attempt", Side: "client"}}
	release, holding := make(chan struct{}), make(chan struct{}, 1)
	startServer(t, cfg, func(s *kernrpc.Server) {
		// Both ignore their context: a server that does not answer by the
		// deadline (a handler stuck, or another make's server).
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			holding <- struct{}{}
			<-release
			return req, nil
		})
		kernrpc.Handle(s, "Echo.Detached", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	// A call with a deadline of its own, longer, holds the reader role.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held := cli.Go(ctx, "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}, nil)
	receive(t, holding, 5*time.Second, "Echo.Hold was not served")
	time.Sleep(100 * time.Millisecond) // its caller waits, reading, by now

	var resp echopb.Echo
	callCtx := context.Background()
	if cancelable { // the engine then gives the deadline with context.WithTimeout
		c, cancel := context.WithCancel(callCtx)
		defer cancel()
		callCtx = c
	}
	if err := cli.Call(callCtx, "Echo.Detached", &echopb.Echo{}, &resp); err != nil || resp.Text != "fallback" {
		t.Fatalf("Call: %v, %q; want the fallback", err, resp.Text)
	}
	start := time.Now()
	select {
	case err := <-detachedEnded:
		t.Logf("the detached attempt ended after %v: %v", time.Since(start), err)
	case <-time.After(2 * time.Second):
		t.Errorf("the attempt left running still waits %v after its call returned, past its 300ms deadline", time.Since(start))
		close(release)
		released = true
		<-detachedEnded
	}
	if !released {
		close(release)
		released = true
	}
	receive(t, held.Done, 5*time.Second, "Echo.Hold did not end")
}
