package kernrpc_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// reportBalancer picks the newest instance it was given. When the
// gateAt-th pick fails (picks passed over are not counted), it says so on
// failed, between the try and what the call does next, and waits for
// gate to open.
type reportBalancer struct {
	heldSet
	fails  int
	gateAt int
	gate   chan struct{}
	failed chan struct{}
}

func (b *reportBalancer) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.set)
}

func (b *reportBalancer) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return nil, kernel.ErrNoInstances
	}
	return &b.set[len(b.set)-1], nil
}

func (b *reportBalancer) Done(_ *kernel.Instance, err error) {
	if err == nil || errors.Is(err, kernel.ErrInstanceRefused) {
		return
	}
	b.mu.Lock()
	b.fails++
	gate := b.gate
	if b.fails != b.gateAt {
		gate = nil
	}
	b.mu.Unlock()
	holdAt(gate, b.failed)
}

var lastReportBalancer atomic.Pointer[reportBalancer]

func init() {
	registerLastBalancer("test-report-pick", &lastReportBalancer)
}

// A call waiting for readiness tries again at once when the registry
// reports, even when the report came while its last try was under way:
// it does not sleep out its pause (up to a second by then) with the
// instance that came already listed.
func TestWaitForReadySeesAReportThatCameDuringItsLastTry(t *testing.T) {
	t.Run("call", func(t *testing.T) {
		testReadySeesReport(t, func(ctx context.Context, cli *kernrpc.Client) error {
			return cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}, kernrpc.WaitForReady(true))
		})
	})
	t.Run("stream", func(t *testing.T) {
		testReadySeesReport(t, func(ctx context.Context, cli *kernrpc.Client) error {
			_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "1"}, kernrpc.WaitForReady(true))
			return err
		})
	})
}

func testReadySeesReport(t *testing.T, call func(context.Context, *kernrpc.Client) error) {
	cfg := testConfig(t)
	reg := handRegistry(t, cfg)
	srv := startServer(t, cfg, streamHandlers)
	gone := kernel.Instance{Service: "echo", ID: "gone", Address: fixedAddress(t, "tcp-lv")} // nothing listens
	if err := reg.Register(context.Background(), gone, 0); err != nil {
		t.Fatal(err)
	}

	ccfg := testConfig(t)
	ccfg.Balancer = kernrpc.PluginConfig{Name: "test-report-pick"}
	ccfg.Client.DialTimeout = kernel.Duration(time.Minute) // the call waits without a deadline
	none := 0
	ccfg.Client.Retries = &none
	cli := newClient(t, ccfg)
	b := lastReportBalancer.Load()
	gate, failed := make(chan struct{}), make(chan struct{}, 1)
	b.mu.Lock()
	// After the tenth try of the call fails, its pause is a second (±20%).
	b.gateAt, b.gate, b.failed = 10, gate, failed
	b.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx, cli) }()
	receive(t, failed, 20*time.Second, "the call's tenth try did not fail")
	// As that try ends, a server is reported.
	if err := reg.Register(context.Background(), kernel.Instance{Service: "echo", ID: "up", Address: srv.Addr()}, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return b.size() == 2 }, "the report of the server")
	time.Sleep(50 * time.Millisecond) // the report wakes its waiters just after the balancer has it
	// The call picks again at once, the server that came. It is not held
	// for its pause, which the cancel below would end first.
	time.AfterFunc(400*time.Millisecond, cancel)
	close(gate)
	if err := receive(t, done, 10*time.Second, "the call did not end"); err != nil {
		t.Fatalf("the call waiting for readiness, a server reported during its last try: %v\nwant it answered: it should pick again at once, not sleep out its pause", err)
	}
}
