package kernrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// hangingRegistry keeps its instances in a map. After the first
// registration (the one Start makes), its writes hang until release is
// closed, ignoring their context, as a registry stuck on a dead backend
// might; entered is closed when the first such write begins.
type hangingRegistry struct {
	enginetest.FixedRegistry
	entered, release chan struct{}
	once             sync.Once

	mu     sync.Mutex
	writes int
	live   map[string]bool
}

func newHangingRegistry() *hangingRegistry {
	return &hangingRegistry{entered: make(chan struct{}), release: make(chan struct{}), live: map[string]bool{}}
}

// hang holds every write after the first until release.
func (r *hangingRegistry) hang() {
	r.mu.Lock()
	r.writes++
	first := r.writes == 1
	r.mu.Unlock()
	if !first {
		r.once.Do(func() { close(r.entered) })
		<-r.release
	}
}

func (r *hangingRegistry) Register(_ context.Context, in kernel.Instance, _ time.Duration) error {
	r.hang()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live[in.ID] = true
	return nil
}

func (r *hangingRegistry) Deregister(_ context.Context, in kernel.Instance) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, in.ID)
	return nil
}

func (r *hangingRegistry) registered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// hangingLoads is a hangingRegistry that takes load reports, which hang.
type hangingLoads struct{ *hangingRegistry }

func (r hangingLoads) ReportLoad(context.Context, kernel.Instance, kernel.Load) error {
	r.hang()
	return nil
}

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-hanging-register", New: func(any) (kernel.Registry, error) {
		return newHangingRegistry(), nil
	}})
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-hanging-loads", New: func(any) (kernel.Registry, error) {
		return hangingLoads{newHangingRegistry()}, nil
	}})
}

// shutdownWithin shuts srv down with a context of d, and returns
// Shutdown's error once it returns.
func shutdownWithin(t *testing.T, srv *kernrpc.Server, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	return receive(t, shut, 10*time.Second, "Shutdown waited on a hung registry write past its context")
}

// A registration that hangs (SetServingStatus bringing the server back)
// holds Shutdown no longer than Shutdown's context; when it finally lands,
// the server, shut down meanwhile, takes it out again, and says so.
func TestShutdownOutlastsNoHungRegistration(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-hanging-register"}
	srv := startServer(t, cfg, nil)
	reg, _ := kernrpc.FindPlugin[*hangingRegistry](srv.Plugins(), "test-hanging-register")
	ctx := context.Background()
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	back := make(chan error, 1)
	go func() { back <- srv.SetServingStatus(ctx, "", kernrpc.HealthServing) }()
	receive(t, reg.entered, 10*time.Second, "SetServingStatus never reached the registry")

	err := shutdownWithin(t, srv, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `registry "test-hanging-register": deregister echo@`) ||
		!strings.Contains(err.Error(), "waiting for another registry write to finish: context deadline exceeded") {
		t.Errorf("Shutdown behind a hung registration: %v; want the deregistration's wait named", err)
	}
	close(reg.release)
	err = receive(t, back, 10*time.Second, "the hung registration never returned")
	if err == nil || !strings.Contains(err.Error(), "the server began shutting down meanwhile; taken out again") {
		t.Errorf("a registration landing after Shutdown: %v; want it said to be undone", err)
	}
	if n := reg.registered(); n != 0 {
		t.Errorf("%d instances registered after Shutdown, want 0", n)
	}
}

// A load report that hangs holds Shutdown no longer than its context, and
// the deregistration, which must not come before the report lands, is
// reported as not made.
func TestShutdownOutlastsNoHungLoadReport(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-hanging-loads"}
	cfg.Server.LoadReportInterval = kernel.Duration(10 * time.Millisecond)
	srv := startServer(t, cfg, nil)
	reg, _ := kernrpc.FindPlugin[hangingLoads](srv.Plugins(), "test-hanging-loads")
	// A call gives the next interval a QPS above the idle one: a load
	// worth reporting.
	if err := directClient(t, cfg, srv).Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	receive(t, reg.entered, 10*time.Second, "no load report reached the registry")

	err := shutdownWithin(t, srv, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "waiting for another registry write to finish") {
		t.Errorf("Shutdown behind a hung load report: %v; want the deregistration's wait named", err)
	}
	if n := reg.registered(); n != 1 {
		t.Errorf("%d instances registered; the deregistration must wait for the report, want 1", n)
	}
	close(reg.release)
}
