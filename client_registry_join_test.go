package kernrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// gatedUpdateBalancer is a gatedPickBalancer whose Update, while its
// updateGate is set, having taken its set (so that picks see it), says
// so on updating and waits for the gate to open before it returns, as a
// balancer does for a moment while the registry's report goes on.
type gatedUpdateBalancer struct {
	gatedPickBalancer
	updateGate chan struct{}
	updating   chan struct{}
}

func (b *gatedUpdateBalancer) Update(set []kernel.Instance) {
	b.mu.Lock()
	b.set = set
	gate, updating := b.updateGate, b.updating
	b.updateGate = nil
	b.mu.Unlock()
	holdAt(gate, updating)
}

var lastGatedUpdate atomic.Pointer[gatedUpdateBalancer]

func init() {
	registerLastBalancer("test-gated-update", &lastGatedUpdate)
}

// An instance the registry just reported is called as soon as the
// balancer picks it, even while the report is still being taken in: the
// client does not take it for one that left the registry (which would
// fail the call, every try landing on the newcomer, with "left the
// registry").
func TestAnInstanceJustReportedIsCalledWhileTheReportIsTakenIn(t *testing.T) {
	cfg := testConfig(t)
	ccfg := *cfg
	ccfg.Balancer = kernrpc.PluginConfig{Name: "test-gated-update"}
	cli := newClient(t, &ccfg) // no instance yet
	b := lastGatedUpdate.Load()
	gate, updating := make(chan struct{}), make(chan struct{}, 1)
	b.mu.Lock()
	b.updateGate, b.updating = gate, updating
	b.mu.Unlock()
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
	}()

	startServer(t, cfg, nil)
	receive(t, updating, 5*time.Second, "no report of the server registering")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var resp echopb.Echo
	err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "hi"}, &resp)
	close(gate)
	opened = true
	if err != nil || resp.Text != "hi" {
		t.Fatalf("a call to the instance just reported: %v; want it answered", err)
	}
	// Taken in, the report keeps the pool the call made.
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "again"}, &resp); err != nil || resp.Text != "again" {
		t.Fatalf("a call once the report was taken in: %v", err)
	}
}

// holdDialTCP is tcp-lv whose dials to one address (hold) never connect:
// they wait for their context to end, as a dial to a host that went dark
// does, saying so on held.
type holdDialTCP struct {
	kernel.Transport
	hold atomic.Pointer[string]
	held chan struct{}
}

func (h *holdDialTCP) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	if a := h.hold.Load(); a != nil && *a == addr {
		select {
		case h.held <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.Transport.Dial(ctx, addr)
}

var holdDial = &holdDialTCP{held: make(chan struct{}, 1)}

func init() {
	registerTCPWrapper("test-hold-dial-tcp", "test: tcp-lv whose dials to one address hang", &holdDial.Transport, holdDial)
}

// A dial to an instance that leaves the registry ends as it leaves: the
// call waiting for it goes to an instance still listed, rather than wait
// out dial_timeout for a connection the client would close at once.
func TestADialToAnInstanceThatLeftEndsAsItLeaves(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-hold-dial-tcp", nil
	reg := handRegistry(t, cfg)
	a, b := startNamed(t, cfg, "a", nil), startNamed(t, cfg, "b", nil)
	instA := kernel.Instance{Service: "echo", ID: "a", Address: a.srv.Addr()}
	instB := kernel.Instance{Service: "echo", ID: "b", Address: b.srv.Addr()}
	if err := reg.Register(context.Background(), instA, 0); err != nil {
		t.Fatal(err)
	}
	addrA := instA.Address
	holdDial.hold.Store(&addrA)
	defer holdDial.hold.Store(nil)
	select {
	case <-holdDial.held:
	default:
	}

	ccfg := *cfg
	ccfg.Registry.Options = map[string]any{"namespace": t.Name()}
	ccfg.Client.DialTimeout = kernel.Duration(30 * time.Second)
	cli := newClient(t, &ccfg)
	done := make(chan error, 1)
	var resp echopb.Echo
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &resp)
	}()
	receive(t, holdDial.held, 5*time.Second, "the call did not dial the first instance")
	if err := reg.Register(context.Background(), instB, 0); err != nil {
		t.Fatal(err)
	}
	if err := reg.Deregister(context.Background(), instA); err != nil {
		t.Fatal(err)
	}
	err := receive(t, done, 10*time.Second, "the call waited on its dial to an instance that left (dial_timeout 30s)")
	if err != nil || resp.Text != "b" {
		t.Fatalf("the call whose instance left as it dialled: %v, %q; want it answered by b", err, resp.Text)
	}
}
