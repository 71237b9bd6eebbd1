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
