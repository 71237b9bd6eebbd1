package kernrpc_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// gatedTCP is tcp-lv whose Dial counts itself and waits for gate to
// close (or for its context to end, as a transport's Dial must), so that
// callers pile up behind one dial.
type gatedTCP struct {
	kernel.Transport
	dials atomic.Int32
	gate  chan struct{}
	first atomic.Pointer[time.Time] // the deadline the first dial's context carried
}

func (g *gatedTCP) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	if g.dials.Add(1) == 1 {
		dl, _ := ctx.Deadline()
		g.first.Store(&dl)
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Transport.Dial(ctx, addr)
}

var gated = &gatedTCP{gate: make(chan struct{})}

func init() {
	registerTCPWrapper("test-gated-tcp", "test: tcp-lv whose dials wait for a gate", &gated.Transport, gated)
}

// startGated resets gated (before any Dial of the test, so -count=N is
// safe; its gate stays shut until the test opens it), starts a server on
// it and returns the config, for a client of it.
func startGated(t *testing.T) *kernrpc.Config {
	t.Helper()
	gated.dials.Store(0)
	gated.gate = make(chan struct{})
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-gated-tcp", nil
	startServer(t, cfg, nil)
	return cfg
}

// registerTCPWrapper registers w, a test transport that wraps tcp-lv,
// under name; the tcp-lv inside it, *inner, is built on first use.
func registerTCPWrapper(name, desc string, inner *kernel.Transport, w kernel.Transport) {
	kernel.RegisterTransport(kernel.NewFactory(name, desc,
		func() *struct{} { return &struct{}{} },
		func(*struct{}) (kernel.Transport, error) {
			if *inner == nil {
				tr, err := kernel.NewTransport("tcp-lv", nil, "test")
				if err != nil {
					return nil, err
				}
				*inner = tr
			}
			return w, nil
		}))
}

// The caller that finds no connection dials on its own goroutine; the
// callers that come while it dials wait for that one dial, and all of them
// get its connection, whatever their contexts: one that cannot be
// canceled, one that can, or a deadline client.timeout gives.
func TestCallersShareOneDial(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		ctx     func(t *testing.T) context.Context
	}{
		{"background", 0, func(*testing.T) context.Context { return context.Background() }},
		{"cancelable", 0, func(t *testing.T) context.Context { return t.Context() }},
		{"client.timeout", time.Minute, func(*testing.T) context.Context { return context.Background() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := startGated(t)
			cfg.Client.Timeout = kernel.Duration(tc.timeout)
			cli := newClient(t, cfg)
			const callers = 8
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for range callers {
				wg.Go(func() {
					var resp echopb.Echo
					errs <- cli.Call(tc.ctx(t), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
				})
			}
			time.Sleep(50 * time.Millisecond) // let them all find the dial under way
			close(gated.gate)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("a caller behind the shared dial: %v", err)
				}
			}
			if n := gated.dials.Load(); n != 1 {
				t.Fatalf("%d callers made %d dials; want 1, shared", callers, n)
			}
		})
	}
}

// A caller whose deadline comes before its dial completes gives up at its
// deadline, and the dial starts over on a goroutine of the client's, for
// the next caller, who waits for it instead of dialling again.
func TestHurriedCallerDoesNotCutItsDialShort(t *testing.T) {
	cfg := startGated(t)
	cfg.Client.Timeout = kernel.Duration(100 * time.Millisecond) // dial_timeout is 5s
	cli := newClient(t, cfg)
	var resp echopb.Echo
	start := time.Now()
	err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), "while connecting to") {
		t.Fatalf("a call whose deadline passed while its dial hung: %v; want DeadlineExceeded while connecting", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the call gave up %s after it started; it must not wait out the dial", took)
	}
	// The caller's deadline, not dial_timeout's, reached the transport,
	// for one that dials by its context's deadline.
	if dl := *gated.first.Load(); dl.IsZero() || dl.After(start.Add(time.Second)) {
		t.Fatalf("the caller's dial carried the deadline %v (the call started at %v with 100ms); want the caller's", dl, start)
	}
	waitFor(t, func() bool { return gated.dials.Load() == 2 }, "second dial, started without the caller")
	close(gated.gate) // the dial, still under way, completes
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp); err != nil {
		t.Fatalf("the next call: %v", err)
	}
	if n := gated.dials.Load(); n != 2 {
		t.Fatalf("%d dials; want 2: the hurried caller's and the one started for the next call, which used it", n)
	}
}

// A caller canceled while it dials gets Canceled at once, and the dial
// starts over without it, as for a caller whose deadline passed.
func TestCanceledCallerHandsItsDialOn(t *testing.T) {
	cfg := startGated(t)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		var resp echopb.Echo
		errc <- cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
	}()
	waitFor(t, func() bool { return gated.dials.Load() == 1 }, "dial by the caller")
	cancel()
	if err := <-errc; kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "while connecting to") {
		t.Fatalf("a call canceled while it dialled: %v; want Canceled while connecting", err)
	}
	waitFor(t, func() bool { return gated.dials.Load() == 2 }, "second dial, started without the caller")
	close(gated.gate)
	var resp echopb.Echo
	if err := cli.Call(t.Context(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp); err != nil {
		t.Fatalf("the next call: %v", err)
	}
	if n := gated.dials.Load(); n != 2 {
		t.Fatalf("%d dials; want 2, the second one used by the next call", n)
	}
}

// Close ends a dial under way, whoever runs it: a caller that cannot give
// up (its dial bounded by the client's life) or one that can (its own
// context's dial, with the client's life attached). Close returns at once, and the callers learn
// that the client is closed.
func TestCloseEndsTheDialsUnderWay(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"background", func(*testing.T) context.Context { return context.Background() }},
		{"cancelable", func(t *testing.T) context.Context { return t.Context() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := startGated(t)
			cli, err := kernrpc.NewClient(cfg, "")
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() {
				var resp echopb.Echo
				errc <- cli.Call(tc.ctx(t), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
			}()
			waitFor(t, func() bool { return gated.dials.Load() == 1 }, "dial by the caller")
			start := time.Now()
			if err := cli.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("Close took %s with a dial under way; dial_timeout is 5s, and Close must not wait it out", took)
			}
			select {
			case err := <-errc:
				if kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "is closed") {
					t.Fatalf("a call whose dial the client's Close ended: %v; want Canceled, the client is closed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the call whose dial Close ended did not return")
			}
		})
	}
}

// lateDialTCP is tcp-lv whose Dial waits for gate and then connects
// whatever its context says: a dial that completes just as Close ends
// it.
type lateDialTCP struct {
	kernel.Transport
	dials atomic.Int32
	gate  chan struct{}
}

func (l *lateDialTCP) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	l.dials.Add(1)
	<-l.gate
	return l.Transport.Dial(context.Background(), addr)
}

var lateDial = &lateDialTCP{}

func init() {
	registerTCPWrapper("test-late-dial-tcp", "test: tcp-lv whose dials complete after Close", &lateDial.Transport, lateDial)
}

// A dial that completes after Close began, its connection made all the
// same, gives its callers what Close promises, Canceled "client … is
// closed", not "instance … left the registry": the instance did not
// leave.
func TestADialCompletingAsTheClientClosesSaysTheClientIsClosed(t *testing.T) {
	lateDial.dials.Store(0)
	lateDial.gate = make(chan struct{})
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-late-dial-tcp", nil
	startServer(t, cfg, nil)
	zero := 0
	cfg.Client.Retries = &zero // the call's first error is its last
	cli, err := kernrpc.NewClient(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &echopb.Echo{}) }()
	waitFor(t, func() bool { return lateDial.dials.Load() == 1 }, "dial by the caller")
	closed := make(chan error, 1)
	go func() { closed <- cli.Close() }()
	// Close has closed the pools once a call finds none.
	waitFor(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
		return strings.Contains(err.Error(), "is closed")
	}, "call told the client is closed")
	close(lateDial.gate)
	if err := receive(t, closed, 5*time.Second, "Close did not return"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	err = receive(t, errc, 5*time.Second, "the call whose dial completed as the client closed did not return")
	if kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "is closed") {
		t.Fatalf("a call whose dial completed as the client closed: %v; want Canceled, the client is closed", err)
	}
}
