package kernrpc_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// gatedTCP is tcp-lv whose Dial counts itself and waits for gate to
// close, so that callers pile up behind one dial.
type gatedTCP struct {
	kernel.Transport
	dials atomic.Int32
	gate  chan struct{}
}

func (g *gatedTCP) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	g.dials.Add(1)
	<-g.gate
	return g.Transport.Dial(ctx, addr)
}

var gated = &gatedTCP{gate: make(chan struct{})}

func init() {
	registerTCPWrapper("test-gated-tcp", "test: tcp-lv whose dials wait for a gate", &gated.Transport, gated)
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

// Callers that cannot give up before a dial does (a context that cannot
// be canceled, or a deadline client.timeout gives that is dial_timeout
// away or more) dial on their own goroutine, the first of them, instead of
// a dialer's; the rest still wait for that one dial, and all of them get
// its connection.
func TestCallersThatCannotGiveUpShareOneDial(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run("client.timeout="+timeout.String(), func(t *testing.T) {
			gated.dials.Store(0)
			gated.gate = make(chan struct{}) // before any Dial of this test: -count=N safe
			cfg := testConfig(t)
			cfg.Transport.Name, cfg.Transport.Options = "test-gated-tcp", nil
			startServer(t, cfg, nil)
			cfg.Client.Timeout = kernel.Duration(timeout)
			cli := newClient(t, cfg)
			const callers = 8
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for range callers {
				wg.Go(func() {
					var resp echopb.Echo
					errs <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
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

// A caller whose deadline comes before dial_timeout leaves the dial to a
// goroutine of its own: it gives up waiting at its deadline, and the dial
// it started goes on, for the next caller, without a second dial.
func TestHurriedCallerDoesNotCutItsDialShort(t *testing.T) {
	gated.dials.Store(0)
	gated.gate = make(chan struct{})
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-gated-tcp", nil
	startServer(t, cfg, nil)
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
	close(gated.gate) // the dial, still under way, completes
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp); err != nil {
		t.Fatalf("the next call: %v", err)
	}
	if n := gated.dials.Load(); n != 1 {
		t.Fatalf("%d dials; want the hurried caller's one, which the next call used", n)
	}
}
