package kernrpc_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/raceflag"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/timeout"
)

// keepCtx hands the context each call's filters get, and one derived from
// it, to the test, which watches them after the call returned.
type keepCtx struct{ kept chan [2]context.Context }

func (k keepCtx) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	derived, cancel := context.WithCancel(ctx)
	_ = cancel // the test waits for the call's end to cancel derived, as it would a WithTimeout's
	k.kept <- [2]context.Context{ctx, derived}
	return next(ctx, info, req)
}

var kept = make(chan [2]context.Context, 16)

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-keep-ctx", New: func(any) (kernel.Filter, error) { return keepCtx{kept}, nil }})
}

// blockingServer serves Echo.Block, which waits for its context's end and
// returns its error, besides Echo.Echo.
func blockingServer(t *testing.T, cfg *kernrpc.Config) {
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Block", func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
}

// The deadline the client gives a call in place (client.timeout, a
// Deadliner) reads like a WithTimeout's: its filters see it, it reaches
// the server, and once the call has returned the context it lived in,
// and any derived from it, is done with Canceled, for the next call
// reuses what timed it.
func TestGivenDeadlineEndsWithItsCall(t *testing.T) {
	cfg := testConfig(t)
	blockingServer(t, cfg)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-keep-ctx", Side: "client"}, {Name: timeout.Name, Side: "client", Options: map[string]any{"default": "10s"}}}
	cli := newClient(t, cfg)
	for i := range 3 {
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &echopb.Echo{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		ctxs := receive(t, kept, time.Second, "the filter kept no context")
		for j, ctx := range ctxs {
			dl, ok := ctx.Deadline()
			if left := time.Until(dl); !ok || left > 10*time.Second || left < 9*time.Second {
				t.Errorf("call %d, context %d: deadline %v (set %v), want the timeout filter's 10s", i, j, dl, ok)
			}
			receive(t, ctx.Done(), time.Second, "a context of a call that returned is not done")
			if err := ctx.Err(); err != context.Canceled {
				t.Errorf("call %d, context %d: Err() = %v after the call, want context.Canceled", i, j, err)
			}
		}
	}
}

// Every caller waiting on one connection, the reader and the others,
// ends at its deadline with the error naming who gave it, and the
// connection serves calls afterwards.
func TestGivenDeadlineEndsEveryWaiter(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		set        func(*kernrpc.Config)
	}{
		{"client.timeout", "deadline from client.timeout (50ms", func(c *kernrpc.Config) { c.Client.Timeout = kernel.Duration(50 * time.Millisecond) }},
		{"filter", "the 50ms deadline the timeout filter gave the call", func(c *kernrpc.Config) {
			c.Filters = []kernrpc.FilterConfig{{Name: timeout.Name, Side: "client", Options: map[string]any{"default": "50ms"}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			blockingServer(t, cfg)
			tc.set(cfg)
			cli := newClient(t, cfg)
			for round := range 2 {
				var wg sync.WaitGroup
				errs := make([]error, 8)
				took := make([]time.Duration, 8)
				for i := range errs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						errs[i] = cli.Call(context.Background(), "Echo.Block", &echopb.Echo{}, &echopb.Echo{})
						took[i] = time.Since(start)
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), tc.want) || took[i] > 2*time.Second {
						t.Errorf("round %d, caller %d: after %v: %v; want DeadlineExceeded saying %q", round, i, took[i], err, tc.want)
					}
				}
				if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "after"}, &echopb.Echo{}); err != nil {
					t.Errorf("round %d: a call after the deadlines: %v", round, err)
				}
			}
		})
	}
}

// A deadline the client or a Deadliner gives costs no allocation on
// either side beyond what any client filter costs (the context filters
// get): the engine keeps it in its own contexts, and tcp-lv waits for it
// with a socket deadline.
func TestGivenDeadlineCostsNoAllocation(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("the race detector makes sync.Pool drop items, so pooled paths allocate")
	}
	tenSeconds := map[string]any{"default": "10s"}
	measure := func(server, client string) float64 {
		cfg := testConfig(t)
		cfg.Registry.Options["namespace"] = t.Name() + "/" + server + "/" + client
		cfg.Filters = []kernrpc.FilterConfig{{Name: server, Side: "server", Options: map[string]any{}}}
		if server == timeout.Name {
			cfg.Filters[0].Options = tenSeconds
		}
		startServer(t, cfg, nil)
		cfg.Filters = []kernrpc.FilterConfig{{Name: client, Side: "client"}}
		if client == timeout.Name {
			cfg.Filters[0].Options = tenSeconds
		}
		cli := newClient(t, cfg)
		req, resp := &echopb.Echo{Payload: make([]byte, 16)}, &echopb.Echo{}
		call := func() {
			if err := cli.Call(context.Background(), "Echo.Echo", req, resp); err != nil {
				t.Fatal(err)
			}
		}
		for range 100 {
			call()
		}
		return testing.AllocsPerRun(500, call)
	}
	pass := measure("bench-pass", "bench-pass")
	t.Logf("allocations per call, both sides, with a pass-through filter on each: %.1f", pass)
	for _, tc := range []struct{ what, server, client string }{
		{"the client's timeout filter", "bench-pass", timeout.Name},
		{"the server's timeout filter", timeout.Name, "bench-pass"},
	} {
		given := measure(tc.server, tc.client)
		t.Logf("with %s giving the deadline instead: %.1f", tc.what, given)
		if given > pass {
			t.Errorf("a call %s gave a deadline allocates %.1f times, one through pass-through filters %.1f", tc.what, given, pass)
		}
	}
}

// A server's deadline is kept, not timed, until the handler asks for
// Done: a handler that only looks at Err still finds it passed, and the
// answer says which filter gave it.
func TestServerDeadlineWithoutDoneReadsTheClock(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: timeout.Name, Side: "server", Options: map[string]any{"default": "30ms"}}}
	errs := make(chan error, 2)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Sleep", func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
			errs <- ctx.Err()
			time.Sleep(60 * time.Millisecond)
			err := ctx.Err()
			errs <- err
			return nil, err
		})
	})
	cfg.Filters = nil
	err := newClient(t, cfg).Call(context.Background(), "Echo.Sleep", &echopb.Echo{}, &echopb.Echo{})
	if before, after := <-errs, <-errs; before != nil || after != context.DeadlineExceeded {
		t.Errorf("the handler's ctx.Err() was %v before its deadline and %v after it, want nil and DeadlineExceeded", before, after)
	}
	const want = "the 30ms deadline the timeout filter gave the call (the client sent none) passed while the server ran Echo.Sleep"
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), want) {
		t.Errorf("call: %v; want DeadlineExceeded saying %q", err, want)
	}
}

// A call whose deadline the client gave it (client.timeout) and that waited
// for an instance before its first request left must not send the timeout
// as given: the server would get more time than the call has left.
func TestAGivenTimeoutSentAfterAWaitIsWhatIsLeft(t *testing.T) {
	cfg := testConfig(t)
	cfg.Client.Timeout = kernel.Duration(time.Second)
	cli := newClient(t, cfg)
	left := make(chan time.Duration, 1)
	answered := make(chan error, 1)
	go func() {
		answered <- cli.Call(context.Background(), "Echo.Deadline", &echopb.Echo{}, &echopb.Echo{})
	}()
	time.Sleep(500 * time.Millisecond) // the call waits for an instance
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Deadline", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			dl, _ := ctx.Deadline()
			left <- time.Until(dl)
			return req, nil
		})
	})
	if err := receive(t, answered, 5*time.Second, "the call"); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, left, time.Second, "the handler"); got > 600*time.Millisecond {
		t.Errorf("the handler got %v to run a call with about 500ms left", got)
	}
}

// A deadline too far away to matter (a WithTimeout of math.MaxInt64, the
// usual way to say "no timeout" where one is required) reaches the
// handler as a deadline in the future: placed in the server's clock, it
// must not wrap around into the past and end the call before it starts.
func TestAFarDeadlineDoesNotWrapIntoThePast(t *testing.T) {
	cfg := testConfig(t)
	type seen struct {
		err      error
		deadline time.Time
	}
	got := make(chan seen, 1)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Far", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			dl, _ := ctx.Deadline()
			got <- seen{ctx.Err(), dl}
			return req, ctx.Err()
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(math.MaxInt64))
	defer cancel()
	err := cli.Call(ctx, "Echo.Far", &echopb.Echo{}, &echopb.Echo{})
	s := receive(t, got, 10*time.Second, "the handler did not run")
	if s.err != nil || err != nil {
		t.Errorf("a call with a deadline centuries away: the handler's ctx.Err() = %v, the call %v; want both nil", s.err, err)
	}
	if !s.deadline.After(time.Now().Add(100 * 365 * 24 * time.Hour)) {
		t.Errorf("the handler's deadline is %v; want one centuries away, as the caller's", s.deadline)
	}
}

// A call whose context was cancelled before it was made is not sent, as
// one whose deadline passed is not (and as a stream is not opened): the
// server would run the handler, which may act, only to have the Cancel
// that follows end it, while the caller hears Canceled.
func TestACallCancelledBeforeItIsSentNeverReachesTheServer(t *testing.T) {
	cfg := testConfig(t)
	var ran atomic.Int32
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Act", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			ran.Add(1)
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	// One call first, so that the connection is up and the context, not a
	// dial, is what the call meets.
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cli.Call(ctx, "Echo.Act", &echopb.Echo{}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.Canceled {
		t.Fatalf("call with a cancelled context: %v; want Canceled", err)
	}
	// The cancelled call would have reached the server, on the same
	// connection, before this one.
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("the server ran the handler of a call cancelled before it was made %d times; want none", n)
	}
}
