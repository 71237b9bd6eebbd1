package consultest_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
)

// backend is an echo server registered in the stand-in, failing every
// call when bad.
type backend struct {
	srv   *kernrpc.Server
	calls atomic.Int64
}

// engineConfig is enginetest's config, its instances found through the
// stand-in at addr.
func engineConfig(t *testing.T, addr string) *kernrpc.Config {
	cfg := enginetest.Config(t)
	cfg.Registry = kernrpc.PluginConfig{Name: consul.Name, Options: options(addr)}
	return cfg
}

func serveEcho(t *testing.T, cfg *kernrpc.Config, bad bool) *backend {
	b := &backend{}
	b.srv = enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
			b.calls.Add(1)
			if bad {
				return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
			}
			return &echopb.Echo{Text: "ok"}, nil
		})
	})
	return b
}

func dialBreaker(t *testing.T, cfg *kernrpc.Config, opts map[string]any) (*kernrpc.Client, *breaker.Filter) {
	t.Helper()
	cli := enginetest.Dial(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: breaker.Name, Side: "client", Options: opts}))
	f, ok := kernrpc.FindPlugin[*breaker.Filter](cli.Plugins(), breaker.Name)
	if !ok {
		t.Fatal("no breaker among the client's plugins")
	}
	return cli, f
}

// Two clients of one agent: once A's breaker opens for the failing
// instance, B refuses it from its first call, as with etcd.
func TestBreakerOpeningSharedThroughConsul(t *testing.T) {
	s := standIn(t, fast)
	cfg := engineConfig(t, s.Addr())
	bad := serveEcho(t, cfg, true)
	serveEcho(t, cfg, false)
	opts := map[string]any{"share": "registry", "min_requests": 3, "open_duration": "30s"}
	a, fa := dialBreaker(t, cfg, opts)
	b, fb := dialBreaker(t, cfg, opts)
	look := open(t, s.Addr(), nil)
	eventually(t, 5*time.Second, "both instances passing", func() bool {
		set, err := look.Resolve(ctx(t), cfg.Service)
		return err == nil && len(set) == 2
	})

	addr := bad.srv.Addr()
	for i := 0; fa.State("Echo.Who", addr) != breaker.Open; i++ {
		if i == 100 {
			t.Fatalf("A's breaker for %s did not open in 100 calls", addr)
		}
		_ = a.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	eventually(t, 5*time.Second, "B's breaker open after A's", func() bool { return fb.State("Echo.Who", addr) == breaker.Open })
	sent := bad.calls.Load()
	for i := range 12 {
		if err := b.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
			t.Fatalf("B's call %d: %v; want the good instance's answer", i, err)
		}
	}
	if n := bad.calls.Load() - sent; n != 0 {
		t.Errorf("B sent %d calls to the instance A's breaker opened for; want none", n)
	}
	pairs, _, err := apiClient(t, s.Addr()).KV().List("kernrpc/shared/breaker/default/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, p := range pairs {
		keys = append(keys, p.Key)
	}
	if want := "kernrpc/shared/breaker/default/Echo.Who|" + addr; strings.Join(keys, " ") != want {
		t.Errorf("shared keys %v; want %s", keys, want)
	}
}
