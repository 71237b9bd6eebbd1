package kernrpc_test

import (
	"context"
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
	kernel.RegisterTransport(kernel.NewFactory("test-gated-tcp", "test: tcp-lv whose dials wait for a gate",
		func() *struct{} { return &struct{}{} },
		func(*struct{}) (kernel.Transport, error) {
			if gated.Transport == nil {
				tr, err := kernel.NewTransport("tcp-lv", nil, "test")
				if err != nil {
					return nil, err
				}
				gated.Transport = tr
			}
			return gated, nil
		}))
}

// Callers whose context cannot be canceled dial on their own goroutine
// (the first of them) instead of a dialer's; the rest still wait for that
// one dial, and all of them get its connection.
func TestCallersThatCannotGiveUpShareOneDial(t *testing.T) {
	gated.dials.Store(0)
	gated.gate = make(chan struct{}) // before any Dial of this test: -count=N safe
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-gated-tcp", nil
	startServer(t, cfg, nil)
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
}
