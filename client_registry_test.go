package kernrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registerWrapped registers, as name, a memory registry that wrap
// changes: cut down, or failing where a test needs it to.
func registerWrapped(name string, wrap func(*memory.Registry) kernel.Registry) {
	kernel.RegisterRegistry(kernel.NewFactory(name, "test: a memory registry "+name, memory.DefaultOptions,
		func(o *memory.Options) (kernel.Registry, error) {
			r, err := memory.New(*o)
			if err != nil {
				return nil, err
			}
			return wrap(r), nil
		}))
}

// Two memory registries cut down to one way of following a service: the
// client must follow each through what it has.
func init() {
	registerWrapped("test-watch-only", func(r *memory.Registry) kernel.Registry { return struct{ kernel.Registry }{r} })
	registerWrapped("test-notify-only", func(r *memory.Registry) kernel.Registry { return notifyOnly{r} })
}

// notifyOnly is a memory registry whose Watch fails: a client that falls
// back to Watch cannot be made with it.
type notifyOnly struct{ *memory.Registry }

func (notifyOnly) Watch(context.Context, string) (<-chan []kernel.Instance, error) {
	return nil, errors.New("test: Watch called on a registry with Notify")
}

// TestClientFollowsTheRegistryEitherWay checks both ways the client
// follows its registry (kernel.Notifier, and Watch on a goroutine): a
// call made before the first instance registers waits for it, and once
// that instance has gone and another come, calls go to the new one.
func TestClientFollowsTheRegistryEitherWay(t *testing.T) {
	for _, registry := range []string{"memory", "test-watch-only", "test-notify-only"} {
		t.Run(registry, func(t *testing.T) {
			cfg := testConfig(t)
			ccfg := *cfg
			ccfg.Registry.Name = registry
			cli := newClient(t, &ccfg)
			done := make(chan error, 1)
			var resp echopb.Echo
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &resp)
			}()
			time.Sleep(20 * time.Millisecond)
			first := startNamed(t, cfg, "first", nil)
			if err := receive(t, done, 10*time.Second, "the call never ended"); err != nil || resp.Text != "first" {
				t.Fatalf("call made before the server registered: %v, %q; want it answered by the first instance", err, resp.Text)
			}
			startNamed(t, cfg, "second", nil)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := first.srv.Shutdown(ctx); err != nil {
				t.Fatalf("shutting the first server down: %v", err)
			}
			// Round robin alternates while the first instance is still
			// listed: twenty answers in a row from the second say the
			// client has taken the report of its leaving.
			inARow := 0
			for inARow < 20 {
				if ctx.Err() != nil {
					t.Fatalf("no 20 answers in a row from the second instance within 5s of the first leaving (last: %q)", resp.Text)
				}
				if err := cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &resp); err == nil && resp.Text == "second" {
					inARow++
				} else {
					inARow = 0
				}
			}
		})
	}
}

// watchBroken resolves through a memory registry but cannot watch, and has
// no Notify: a client must fall back to Watch, which fails.
type watchBroken struct{ kernel.Registry }

func (watchBroken) Watch(context.Context, string) (<-chan []kernel.Instance, error) {
	return nil, errors.New("watch refused")
}

func init() {
	registerWrapped("test-watch-broken", func(r *memory.Registry) kernel.Registry { return watchBroken{r} })
}

// A registry that cannot resolve or watch the service when the client is
// made fails NewClient with an error naming the config file, the registry
// and the service, and wrapping the registry's own error.
func TestNewClientReportsTheRegistryFailing(t *testing.T) {
	for _, tc := range []struct{ registry, want string }{
		{"test-console-broken", `registry "test-console-broken": resolve "echo": registry unreachable`},
		{"test-watch-broken", `registry "test-watch-broken": watch "echo": watch refused`},
	} {
		t.Run(tc.registry, func(t *testing.T) {
			cfg, err := kernrpc.ParseConfig([]byte("service: echo\nregistry: "+tc.registry+"\n"), "client.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cli, err := kernrpc.NewClient(cfg, "echo")
			if err == nil {
				cli.Close()
				t.Fatal("NewClient succeeded with a registry that fails")
			}
			var pe *kernel.PluginError
			if !errors.As(err, &pe) || pe.Kind != kernel.KindRegistry || pe.Source != "client.yaml" ||
				!strings.Contains(err.Error(), "client.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewClient: %v (%T); want a registry PluginError from client.yaml containing %q", err, err, tc.want)
			}
		})
	}
}

// Client.Close ends what runs on every connection of the client, also
// those to an instance that has left the registry and still serves what
// was open on them (its drain_period): a stream open there ends with
// Unavailable, and its connection closes.
func TestCloseEndsStreamsOfAnInstanceThatLeft(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.DrainPeriod = kernel.Duration(3 * time.Second)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.HandleServerStream(srv, "Hang.Out", func(ctx context.Context, _ *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	defer func() { <-shut }()
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Hang.Out", &echopb.Echo{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		shut <- srv.Shutdown(sctx) // leaves the registry, serves on for drain_period
	}()
	time.Sleep(300 * time.Millisecond) // the client hears the instance left
	cli.Close()
	got := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		if kernel.CodeOf(err) != kernel.Unavailable {
			t.Errorf("Recv after Close: %v, want Unavailable", err)
		}
	case <-time.After(time.Second):
		t.Errorf("a stream to an instance that left the registry still runs a second after Client.Close")
		<-got
	}
}

// A call waiting for the registry to report an instance ends when the
// client closes, with Canceled ("client … is closed"), as a call waiting
// for a dial or for readiness does, rather than waiting out its deadline.
func TestCloseEndsACallWaitingForAnInstance(t *testing.T) {
	picked := make(chan struct{}, 1)
	emptyPicked.Store(&picked)
	cfg := testConfig(t)
	cfg.Balancer = kernrpc.PluginConfig{Name: "test-empty"}
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}) }()
	receive(t, picked, 5*time.Second, "the call did not ask the balancer")
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	err := receive(t, done, 5*time.Second, "Close left a call waiting for an instance")
	if kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "is closed") {
		t.Fatalf("the call Close ended: %v; want Canceled saying the client is closed", err)
	}
}

// emptyPicked is told of every Pick of a test-empty balancer, which never
// has an instance.
var emptyPicked atomic.Pointer[chan struct{}]

type emptyBalancer struct{}

func (emptyBalancer) Update([]kernel.Instance) {}

func (emptyBalancer) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	if ch := emptyPicked.Load(); ch != nil {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
	return nil, kernel.ErrNoInstances
}

func init() {
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-empty", New: func(any) (kernel.Balancer, error) {
		return emptyBalancer{}, nil
	}})
}

// gatedPickBalancer round-robins over the set it was given; while its
// gate is set, each Pick, having chosen its instance, says so on picked
// and waits for the gate to open before it returns.
type gatedPickBalancer struct {
	heldSet
	next   int
	gate   chan struct{}
	picked chan struct{}
}

func (b *gatedPickBalancer) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	if len(b.set) == 0 {
		b.mu.Unlock()
		return nil, kernel.ErrNoInstances
	}
	b.next++
	inst, gate, picked := &b.set[b.next%len(b.set)], b.gate, b.picked
	b.gate = nil
	b.mu.Unlock()
	holdAt(gate, picked)
	return inst, nil
}

var lastGatedPick atomic.Pointer[gatedPickBalancer]

func init() {
	registerLastBalancer("test-gated-pick", &lastGatedPick)
}

// A call that picked an instance just before the registry reported it
// gone does not open a new pool to it that the client keeps: the report
// dropped the instance's pool, and nothing drops one made after it (the
// next report might come hours later). The call is sent again to an
// instance still listed, as one that found the dropped pool is.
func TestAPickRacingTheInstancesLeavingLeavesNoConnection(t *testing.T) {
	cfg := testConfig(t)
	reg := handRegistry(t, cfg)
	srv := startServer(t, cfg, nil)
	inst := kernel.Instance{Service: "echo", ID: "x", Address: srv.Addr()}
	if err := reg.Register(context.Background(), inst, 0); err != nil {
		t.Fatal(err)
	}

	ccfg := testConfig(t)
	ccfg.Balancer = kernrpc.PluginConfig{Name: "test-gated-pick"}
	ccfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "client"}}
	cli := newClient(t, ccfg)
	b := lastGatedPick.Load()
	obs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}

	gate, picked := make(chan struct{}), make(chan struct{}, 1)
	b.mu.Lock()
	b.gate, b.picked = gate, picked
	b.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		done <- cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
	}()
	receive(t, picked, 5*time.Second, "the call did not pick")
	if err := reg.Deregister(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return obs.readings(t)["client_instances"].Value == 0 }, "report of the instance leaving")
	close(gate)
	err := receive(t, done, 5*time.Second, "the call that picked the instance as it left did not end")
	t.Logf("the call that picked the instance as it left: %v", err)
	if open := obs.readings(t)["client_connections_open"].Value; open != 0 {
		t.Fatalf("%v connections open once the only instance left the registry and the calls ended; want 0: a pool made for the pick that raced the report is kept", open)
	}
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Errorf("the call that picked the instance as it left: %v; want Unavailable, no instance listed", err)
	}
	// Back at the same address, the instance is called again.
	if err := reg.Register(context.Background(), inst, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return obs.readings(t)["client_instances"].Value == 1 }, "report of the instance back")
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatalf("a call once the instance came back: %v", err)
	}
}

// handRegistry has the servers made from cfg register in a namespace of
// their own, and returns a memory registry in the one the test's clients
// read, for the test to list the instances it wants there by hand.
func handRegistry(t *testing.T, cfg *kernrpc.Config) kernel.Registry {
	t.Helper()
	cfg.Registry.Options = map[string]any{"namespace": t.Name() + "-server"}
	opts := memory.DefaultOptions()
	opts.Namespace = t.Name()
	reg, err := memory.New(*opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}
