package kernrpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// Serve blocks until its context ends, then shuts down gracefully: a call
// in flight is answered before Serve returns, and nothing is served after.
func TestServeShutsDownGracefullyWhenItsContextEnds(t *testing.T) {
	cfg := testConfig(t)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	kernrpc.Handle(srv, "Echo.Slow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		close(entered)
		<-release
		return req, nil
	})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()

	cli := newClient(t, cfg)
	answered := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var resp echopb.Echo
		answered <- cli.Call(cctx, "Echo.Slow", &echopb.Echo{Text: "late"}, &resp)
	}()
	receive(t, entered, 10*time.Second, "the call never reached its handler")
	addr := srv.Addr()
	stop()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a call was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := receive(t, answered, 10*time.Second, "the call in flight was never answered"); err != nil {
		t.Errorf("the call in flight when Serve's context ended: %v", err)
	}
	if err := receive(t, served, 10*time.Second, "Serve did not return after its context ended"); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Serve returned", addr)
	}
}

// Serve also returns, with nil, when Shutdown is called elsewhere, and
// returns Start's error when the server cannot start.
func TestServeReturnsOnShutdownAndOnAFailedStart(t *testing.T) {
	cfg := testConfig(t)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cli.Call(ctx, "Echo.Nope", &echopb.Echo{}, &echopb.Echo{}); err == nil || !strings.Contains(err.Error(), "Echo.Nope") {
		t.Fatalf("a call to the served server: %v; want its unknown-method answer", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, served, 10*time.Second, "Serve did not return after Shutdown"); err != nil {
		t.Errorf("Serve after Shutdown: %v, want nil", err)
	}

	// Each way Start can fail leaves nothing running (TestMain's goleak),
	// without waiting for a drain: nothing was served.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := testConfig(t)
	busy.Address = taken.Addr().String()
	srv, err = kernrpc.NewServer(busy)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Errorf("Serve on an address in use: %v; want Start's error naming it", err)
	}

	refused := testConfig(t)
	refused.Registry = kernrpc.PluginConfig{Name: "test-register-broken"}
	refused.Server.DrainPeriod = kernel.Duration(time.Hour)
	if srv, err = kernrpc.NewServer(refused); err != nil {
		t.Fatal(err)
	}
	go func() { served <- srv.Serve(context.Background()) }()
	err = receive(t, served, 10*time.Second, "Serve waited, with a registry that refused the instance")
	if err == nil || !strings.Contains(err.Error(), `registry "test-register-broken": register echo at`) || !strings.Contains(err.Error(), "registration refused") {
		t.Errorf("Serve with a registry that refuses: %v; want the registry's error", err)
	}
}

// A caller of Start whose registration failed shuts the server down with
// a context of its own: no client heard of the instance, so Shutdown
// does not serve on for the drain period waiting for them to hear it
// left.
func TestShutdownAfterAFailedRegistrationWaitsNoDrainPeriod(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-register-broken"}
	cfg.Server.DrainPeriod = kernel.Duration(time.Hour)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded with a registry that refuses every instance")
	}
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	if err := receive(t, shut, 10*time.Second, "Shutdown after a failed registration waited for the hour-long drain period"); err != nil {
		t.Errorf("Shutdown after a failed Start: %v", err)
	}
}

// registerBroken is a registry that refuses every instance.
type registerBroken struct{ enginetest.FixedRegistry }

func (registerBroken) Register(context.Context, kernel.Instance, time.Duration) error {
	return errors.New("registration refused")
}

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-register-broken", New: func(any) (kernel.Registry, error) { return registerBroken{}, nil }})
}

// registerBlocks is a registry whose Register waits for its context,
// telling entered when it begins.
type registerBlocks struct {
	enginetest.FixedRegistry
	entered chan struct{}
}

func (r registerBlocks) Register(ctx context.Context, _ kernel.Instance, _ time.Duration) error {
	close(r.entered)
	<-ctx.Done()
	return ctx.Err()
}

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-register-blocks", New: func(any) (kernel.Registry, error) {
		return registerBlocks{entered: make(chan struct{})}, nil
	}})
}

// Shutdown while Start is still at work (here, registering with a slow
// registry) stops the start and waits for it, so that nothing Start does
// lands after Shutdown undid it; Serve then returns nil, as it does for
// any Shutdown, and the server cannot be started again.
func TestShutdownDuringStart(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-register-blocks"}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := kernrpc.FindPlugin[registerBlocks](srv.Plugins(), "test-register-blocks")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	receive(t, reg.entered, 10*time.Second, "Start never reached the registry")
	addr := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	if err := receive(t, shut, 15*time.Second, "Shutdown during Start did not return by its context"); err != nil {
		t.Errorf("Shutdown during Start: %v", err)
	}
	if err := receive(t, served, 10*time.Second, "Serve did not return after Shutdown"); err != nil {
		t.Errorf("Serve, shut down while starting: %v, want nil", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Shutdown", addr)
	}
	if err := srv.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Errorf("Start after Shutdown: %v", err)
	}
	fresh, err := kernrpc.NewServer(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "has been shut down; make a new one") {
		t.Errorf("Start after Shutdown of a server never started: %v", err)
	}
}

// advertise and server.metadata shape the registered instance: clients
// dial the advertised address, and see the metadata beside the
// transport and codec the server adds.
func TestAdvertiseAndMetadataShapeTheInstance(t *testing.T) {
	cfg := testConfig(t)
	cfg.Advertise = "192.0.2.7:7000"
	cfg.Server.Metadata = map[string]string{"zone": "eu-1"}
	srv := startServer(t, cfg, nil)
	in := srv.Instance()
	if in.Address != "192.0.2.7:7000" || in.ID != "echo@192.0.2.7:7000" || srv.Addr() != "192.0.2.7:7000" {
		t.Errorf("instance %s at %s (Addr %s); want it at the advertised address", in.ID, in.Address, srv.Addr())
	}
	if in.Metadata["zone"] != "eu-1" || in.Metadata["transport"] != "tcp-lv" || in.Metadata["codec"] != "protobuf" {
		t.Errorf("instance metadata %v; want zone, transport and codec", in.Metadata)
	}
	reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, "")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	got, err := reg.Resolve(context.Background(), "echo")
	if err != nil || len(got) != 1 || got[0].Address != "192.0.2.7:7000" || got[0].Metadata["zone"] != "eu-1" {
		t.Errorf("the registry lists %+v, %v; want the advertised instance", got, err)
	}
}
