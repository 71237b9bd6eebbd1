package kernrpc_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// resolveOf is what a fresh registry of cfg's namespace resolves for service.
func resolveOf(t *testing.T, cfg *kernrpc.Config, service string) []kernel.Instance {
	t.Helper()
	reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, "")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	insts, err := reg.Resolve(context.Background(), service)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// directClient calls srv by its address, whatever the registry says.
func directClient(t *testing.T, cfg *kernrpc.Config, srv *kernrpc.Server) *kernrpc.Client {
	t.Helper()
	return staticClient(t, cfg, srv.Addr())
}

func TestHealthCheck(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	ctx := context.Background()
	for _, svc := range []string{"", "echo"} {
		st, err := cli.CheckHealth(ctx, svc)
		if err != nil || st != kernrpc.HealthServing {
			t.Errorf("CheckHealth(%q) = %s, %v; want SERVING", svc, st, err)
		}
	}
	_, err := cli.CheckHealth(ctx, "nosuch")
	if kernel.CodeOf(err) != kernel.NotFound {
		t.Errorf("CheckHealth(nosuch): %v, want NotFound", err)
	}
	if err := srv.SetServingStatus(ctx, "echo", "BUSY"); err == nil {
		t.Error("SetServingStatus accepted an unknown status")
	}
	if err := srv.SetServingStatus(ctx, "reports", kernrpc.HealthUnknown); err != nil {
		t.Fatal(err)
	}
	if st, err := cli.CheckHealth(ctx, "reports"); err != nil || st != kernrpc.HealthUnknown {
		t.Errorf("CheckHealth(reports) = %s, %v; want UNKNOWN", st, err)
	}
	if got := srv.Methods(); len(got) != 2 || got[1] != kernrpc.HealthCheckMethod {
		t.Errorf("Methods() = %v, want Echo.Echo and %s", got, kernrpc.HealthCheckMethod)
	}
}

// A server that says it is not serving leaves the registry, and comes back
// when it serves again; the health service answers either way.
func TestHealthNotServingDeregisters(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	direct := directClient(t, cfg, srv)
	ctx := context.Background()
	if n := len(resolveOf(t, cfg, "echo")); n != 1 {
		t.Fatalf("registered instances: %d, want 1", n)
	}
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if n := len(resolveOf(t, cfg, "echo")); n != 0 {
		t.Errorf("not serving, yet %d instances registered", n)
	}
	if st, err := direct.CheckHealth(ctx, ""); err != nil || st != kernrpc.HealthNotServing {
		t.Errorf("CheckHealth = %s, %v; want NOT_SERVING", st, err)
	}
	// Only the whole server is serving again; its service still is not.
	if err := srv.SetServingStatus(ctx, "echo", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthServing); err != nil {
		t.Fatal(err)
	}
	if n := len(resolveOf(t, cfg, "echo")); n != 0 {
		t.Errorf("service not serving, yet %d instances registered", n)
	}
	if err := srv.SetServingStatus(ctx, "echo", kernrpc.HealthServing); err != nil {
		t.Fatal(err)
	}
	if got := resolveOf(t, cfg, "echo"); len(got) != 1 || got[0].Address != srv.Addr() {
		t.Errorf("serving again: registered %v, want the server at %s", got, srv.Addr())
	}
}

// Shutdown reports not serving and leaves the registry first, serves for
// the drain period, and only then refuses new calls and finishes.
func TestShutdownDrainPeriod(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.DrainPeriod = kernel.Duration(300 * time.Millisecond)
	srv := startServer(t, cfg, nil)
	direct := directClient(t, cfg, srv)
	ctx := context.Background()
	if err := direct.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- srv.Shutdown(ctx) }()
	deadline := time.Now().Add(200 * time.Millisecond)
	for len(resolveOf(t, cfg, "echo")) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the instance is still registered after shutdown began")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st, _ := srv.ServingStatus(""); st != kernrpc.HealthNotServing {
		t.Errorf("status during shutdown: %s, want NOT_SERVING", st)
	}
	// Still serving during the drain period.
	if err := direct.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Errorf("call during the drain period: %v", err)
	}
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthServing); err == nil {
		t.Error("SetServingStatus(SERVING) during shutdown succeeded")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("shutdown took %s, less than the 300ms drain period", took)
	}
}

func TestDrainPeriodBoundedByShutdownDeadline(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.DrainPeriod = kernel.Duration(time.Hour)
	srv := startServer(t, cfg, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = srv.Shutdown(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown with a 100ms deadline took %s (drain period 1h)", took)
	}
}

func TestDrainPeriodValidated(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.DrainPeriod = kernel.Duration(-time.Second)
	_, err := kernrpc.NewServer(cfg)
	if err == nil || !strings.Contains(err.Error(), "server.drain_period") {
		t.Errorf("negative drain_period: %v, want an error naming server.drain_period", err)
	}
}

// The server publishes its load into the registry while calls run, and
// writes nothing more while the load stays the same.
func TestLoadReports(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.LoadReportInterval = kernel.Duration(20 * time.Millisecond)
	release := make(chan struct{})
	held := make(chan struct{}, 3)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			held <- struct{}{}
			<-release
			return req, nil
		})
	})
	reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, "")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	sets, err := reg.Watch(wctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, cfg)
	results := make(chan error, 3)
	for range 3 {
		go func() { results <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}) }()
	}
	for range 3 {
		<-held
	}
	waitLoad(t, sets, func(l kernel.Load) bool { return l.InFlight == 3 })
	// Three calls held: the same load at every tick, so no more writes.
	quiet := time.After(10 * cfg.Server.LoadReportInterval.D())
	changes := 0
loop:
	for {
		select {
		case set := <-sets:
			if len(set) == 1 && set[0].Load.InFlight != 3 {
				t.Errorf("load changed to %+v while three calls were held", set[0].Load)
			}
			changes++
		case <-quiet:
			break loop
		}
	}
	if changes > 0 {
		t.Errorf("%d registry updates in 10 intervals of unchanged load, want 0", changes)
	}
	close(release)
	for range 3 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	waitLoad(t, sets, func(l kernel.Load) bool { return l.InFlight == 0 && l.QPS > 0 })
}

func waitLoad(t *testing.T, sets <-chan []kernel.Instance, ok func(kernel.Load) bool) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case set := <-sets:
			if len(set) == 1 && ok(set[0].Load) {
				return
			}
		case <-timeout:
			t.Fatal("the load reported never matched")
		}
	}
}

// Two SetServingStatus calls racing must leave the registry agreeing with
// the status that was written last: in the registry while SERVING, out of
// it while NOT_SERVING.
func TestRacingSetServingStatusLeavesTheRegistryAgreeing(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	ctx := context.Background()
	for i := range 2000 {
		var wg sync.WaitGroup
		wg.Add(2)
		start := make(chan struct{})
		go func() { defer wg.Done(); <-start; _ = srv.SetServingStatus(ctx, "", kernrpc.HealthNotServing) }()
		go func() { defer wg.Done(); <-start; _ = srv.SetServingStatus(ctx, "", kernrpc.HealthServing) }()
		close(start)
		wg.Wait()
		st, _ := srv.ServingStatus("")
		in := resolveOf(t, cfg, "echo")
		if (st == kernrpc.HealthServing) != (len(in) == 1) {
			t.Fatalf("round %d: status %s, but the registry holds %d instances", i, st, len(in))
		}
	}
}

// A status set before Start is the operator's word: a server told it is
// not serving (still warming up, say) must not announce itself as serving
// and register the instance because it started. The statuses nobody set
// still turn SERVING at Start.
func TestNotServingSetBeforeStartIsKept(t *testing.T) {
	cfg := testConfig(t)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Echo", echo)
	ctx := context.Background()
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetServingStatus(ctx, "reports", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	for svc, want := range map[string]kernrpc.HealthStatus{"": kernrpc.HealthNotServing, "reports": kernrpc.HealthNotServing, "echo": kernrpc.HealthServing} {
		if st, _ := srv.ServingStatus(svc); st != want {
			t.Errorf("ServingStatus(%q) after Start = %s; want %s", svc, st, want)
		}
	}
	if n := len(resolveOf(t, cfg, "echo")); n != 0 {
		t.Errorf("told it is not serving before Start, yet %d instances registered", n)
	}
	// Serving once told so: registered then.
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthServing); err != nil {
		t.Fatal(err)
	}
	if got := resolveOf(t, cfg, "echo"); len(got) != 1 || got[0].Address != srv.Addr() {
		t.Errorf("serving: registered %v, want the server at %s", got, srv.Addr())
	}
}

// registerFailsOnce is a registry whose first Register fails (a registry
// briefly unreachable as the server starts) and whose later ones work;
// it keeps what is registered.
type registerFailsOnce struct {
	enginetest.FixedRegistry
	mu       sync.Mutex
	attempts int
	listed   map[string]kernel.Instance
}

func (r *registerFailsOnce) Register(_ context.Context, in kernel.Instance, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts++
	if r.attempts == 1 {
		return errors.New("registry unreachable")
	}
	r.listed[in.ID] = in
	return nil
}

func (r *registerFailsOnce) Deregister(_ context.Context, in kernel.Instance) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.listed, in.ID)
	return nil
}

func (r *registerFailsOnce) registered() []kernel.Instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Values(r.listed))
}

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-register-fails-once", New: func(any) (kernel.Registry, error) {
		return &registerFailsOnce{listed: map[string]kernel.Instance{}}, nil
	}})
}

// A server whose Start failed serves nothing: its health does not say
// SERVING, and no SetServingStatus puts the instance, whose listener is
// closed, into the registry for clients to pick.
func TestAFailedStartLeavesTheServerNotServingAndUnregistered(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-register-fails-once"}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := kernrpc.FindPlugin[*registerFailsOnce](srv.Plugins(), "test-register-fails-once")
	ctx := context.Background()
	if err := srv.Start(ctx); err == nil {
		t.Fatal("Start succeeded though the registry refused the instance")
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	for _, svc := range []string{"", "echo"} {
		if st, _ := srv.ServingStatus(svc); st == kernrpc.HealthServing {
			t.Errorf("ServingStatus(%q) after a failed Start = %s; the server serves nothing", svc, st)
		}
	}
	err = srv.SetServingStatus(ctx, "", kernrpc.HealthServing)
	if got := reg.registered(); len(got) != 0 {
		t.Fatalf("after a failed Start, SetServingStatus(SERVING) registered %v (error %v): clients would pick an instance that does not listen", got, err)
	}
	if err == nil {
		t.Error("SetServingStatus(SERVING) after a failed Start succeeded; want an error saying the server did not start")
	}
}
