package kernrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// observer is a pass-through filter that keeps the plugins it is shown.
type observer struct {
	mu   sync.Mutex
	refs []kernel.PluginRef
}

func (o *observer) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (o *observer) ObservePlugins(refs []kernel.PluginRef) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refs = refs
}

// readings are what the engine reporter among refs reports, by name.
func (o *observer) readings(t *testing.T) map[string]kernel.Reading {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]kernel.Reading{}
	for _, r := range o.refs {
		if r.Kind == kernel.KindEngine {
			r.Plugin.(kernel.StateReporter).ReportState(func(rd kernel.Reading) { out[rd.Name] = rd })
			return out
		}
	}
	t.Fatalf("no engine reporter among the %d plugins observed", len(o.refs))
	return nil
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-observer", New: func(any) (kernel.Filter, error) { return &observer{}, nil }})
}

func TestPluginsObserverSeesEveryPluginAndTheEngine(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer"}}
	srv := startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	for side, built := range map[string][]kernrpc.BuiltPlugin{"server": srv.Plugins(), "client": cli.Plugins()} {
		obs, ok := kernrpc.FindPlugin[*observer](built, "test-observer")
		if !ok {
			t.Fatalf("%s: observer not built", side)
		}
		obs.mu.Lock()
		kinds := map[kernel.Kind]int{}
		self := false
		wantSide := map[string]kernel.Side{"server": kernel.ServerSide, "client": kernel.ClientSide}[side]
		for _, r := range obs.refs {
			kinds[r.Kind]++
			self = self || r.Plugin == any(obs)
			if r.Side != wantSide {
				t.Errorf("%s observer saw %s %q on side %v", side, r.Kind, r.Name, r.Side)
			}
		}
		obs.mu.Unlock()
		if !self || kinds[kernel.KindTransport] != 1 || kinds[kernel.KindCodec] != 1 || kinds[kernel.KindRegistry] != 1 || kinds[kernel.KindEngine] != 1 {
			t.Errorf("%s observer saw %v (itself: %v), want every plugin once, itself and the engine", side, kinds, self)
		}
		rd := obs.readings(t)
		want := map[string]float64{"server_connections_open": 1, "server_connections_refused_total": 0, "server_connections_accepted_total": 1, "server_serving": 1}
		if side == "client" {
			want = map[string]float64{"client_connections_open": 1, "client_connections_spare": 0, "client_instances": 1}
		}
		if side == "client" {
			// A Watch's first report (the current set) comes on a
			// goroutine of its own: wait for it.
			eventually(5*time.Second, func() bool {
				rd = obs.readings(t)
				return rd["client_registry_updates_total"].Value >= 1
			})
			if r := rd["client_registry_updates_total"]; r.Value < 1 || r.Kind != kernel.Counter {
				t.Errorf("client_registry_updates_total = %+v, want a counter of at least the registry's first report", r)
			}
		}
		for name, v := range want {
			if got, ok := rd[name]; !ok || got.Value != v || got.Help == "" {
				t.Errorf("%s reading %s = %+v, want value %v with help", side, name, got, v)
			}
		}
	}
}

// A connection to an instance that left the registry is still held while
// a call runs on it (it closes once the call is answered): the client
// counts it open until then, as the server counts it, and beside the
// streams it reports on such connections.
func TestConnectionsToAnInstanceThatLeftCountWhileTheyCarryCalls(t *testing.T) {
	cfg := testConfig(t)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", holding(entered, release))
	})
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "client"}}
	cli := newClient(t, cfg)
	obs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")
	done := make(chan error, 1)
	go func() { done <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}) }()
	receive(t, entered, 5*time.Second, "the held call did not reach the handler")
	if n := obs.readings(t)["client_connections_open"].Value; n != 1 {
		t.Fatalf("client_connections_open = %v with a call running, want 1", n)
	}
	// The instance leaves the registry; its call runs on.
	if err := srv.SetServingStatus(context.Background(), "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return obs.readings(t)["client_instances"].Value == 0 }, "registry report of the instance leaving")
	if n := obs.readings(t)["client_connections_open"].Value; n != 1 {
		t.Errorf("client_connections_open = %v while a call runs on the connection to the instance that left, want 1", n)
	}
	close(release)
	if err := receive(t, done, 5*time.Second, "the held call did not return"); err != nil {
		t.Fatalf("the held call: %v", err)
	}
	waitFor(t, func() bool { return obs.readings(t)["client_connections_open"].Value == 0 }, "connection closed once its call was answered")
}
