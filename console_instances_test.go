package kernrpc_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// silentRegistry is a registry whose Resolve waits for its context to
// end (an etcd cluster that does not answer), counting the calls.
type silentRegistry struct {
	enginetest.FixedRegistry
	resolves *atomic.Int32
}

func (r silentRegistry) Resolve(ctx context.Context, _ string) ([]kernel.Instance, error) {
	r.resolves.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

var silentResolves atomic.Int32

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-console-silent", New: func(any) (kernel.Registry, error) {
		return silentRegistry{resolves: &silentResolves}, nil
	}})
}

// A registry that does not answer costs the console one Resolve per
// cache period, as docs/console.md says, not one per page load: the
// page's requests, made every second, must not queue up behind each
// other's Resolve, each waiting its whole timeout.
func TestConsoleKeepsARegistryTimeoutForItsCachePeriod(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-console-silent"}
	cfg.Server.AdminAddress = "127.0.0.1:0"
	srv := startServer(t, cfg, nil)
	silentResolves.Store(0)
	url := "http://" + srv.AdminAddr() + "/status/instances.json"
	var wg sync.WaitGroup
	errs := make([]string, 3)
	for i := range errs {
		wg.Go(func() {
			var inst struct {
				Error string `json:"error"`
			}
			getJSON(t, url, &inst)
			errs[i] = inst.Error
		})
	}
	wg.Wait()
	for i, e := range errs {
		if e == "" {
			t.Errorf("request %d: no error from a registry that did not answer", i)
		}
	}
	if n := silentResolves.Load(); n != 1 {
		t.Errorf("3 page loads at once asked the hanging registry %d times; want 1, the timeout kept for the cache period", n)
	}
	if code, _ := get(t, url); code != http.StatusOK {
		t.Errorf("GET %s: %d", url, code)
	}
	if n := silentResolves.Load(); n != 1 {
		t.Errorf("a page load within the cache period asked the registry again (%d Resolves)", n)
	}
}
