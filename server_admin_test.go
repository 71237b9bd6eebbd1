package kernrpc_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// pagedFilter is a pass-through filter with an admin page.
type pagedFilter struct{}

func (pagedFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (pagedFilter) AdminRoutes() []kernel.AdminRoute {
	return []kernel.AdminRoute{{Pattern: "GET /paged", Doc: "a test page", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "paged ok")
	})}}
}

// rootPagedFilter is a pass-through filter whose admin page claims the
// index, "GET /{$}".
type rootPagedFilter struct{ pagedFilter }

func (rootPagedFilter) AdminRoutes() []kernel.AdminRoute {
	return []kernel.AdminRoute{{Pattern: "GET /{$}", Doc: "a page of its own at the root", Handler: http.NotFoundHandler()}}
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-paged", New: func(any) (kernel.Filter, error) { return pagedFilter{}, nil }})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-root-paged", New: func(any) (kernel.Filter, error) { return rootPagedFilter{}, nil }})
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestAdminPages(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-paged", Side: "server"}}
	srv := startServer(t, cfg, nil)
	base := "http://" + srv.AdminAddr()
	if code, body := get(t, base+"/paged"); code != 200 || body != "paged ok" {
		t.Errorf("/paged: %d %q", code, body)
	}
	code, body := get(t, base+"/")
	if code != 200 || !strings.Contains(body, "GET /paged") || !strings.Contains(body, "filter test-paged") || !strings.Contains(body, "/healthz") {
		t.Errorf("index: %d, does not list the pages:\n%s", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "SERVING") {
		t.Errorf("/healthz while serving: %d %q", code, body)
	}
	if err := srv.SetServingStatus(context.Background(), "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "NOT_SERVING") {
		t.Errorf("/healthz while not serving: %d %q", code, body)
	}
	if code, _ := get(t, base+"/nosuch"); code != http.StatusNotFound {
		t.Errorf("/nosuch: %d, want 404", code)
	}
}

func TestAdminAddressOffByDefault(t *testing.T) {
	srv := startServer(t, testConfig(t), nil)
	if a := srv.AdminAddr(); a != "" {
		t.Errorf("AdminAddr() = %q without server.admin_address", a)
	}
}

func TestAdminStartErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		addr    string
		filters []kernrpc.FilterConfig
		want    string
	}{
		"bad address": {"256.0.0.1:http", nil, `server.admin_address "256.0.0.1:http"`},
		"two plugins, one page": {"127.0.0.1:0",
			[]kernrpc.FilterConfig{{Name: "test-paged", Side: "server"}, {Name: "test-paged", Side: "server"}},
			`filter "test-paged": route "GET /paged"`},
		// The engine's own pages clash like any other: an error naming
		// the plugin and the route, not a panic in Start.
		"a plugin claims the index": {"127.0.0.1:0",
			[]kernrpc.FilterConfig{{Name: "test-root-paged", Side: "server"}},
			`filter "test-root-paged": route "GET /{$}"`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Server.AdminAddress, cfg.Filters = tc.addr, tc.filters
			srv, err := kernrpc.NewServer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = srv.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start: %v, want an error containing %q", err, tc.want)
			}
			_ = srv.Shutdown(context.Background())
		})
	}
}

// The HTTP probe and the console agree with the registry: a server whose
// own service is not serving is out of the registry, and /healthz must
// not tell a load balancer's probe that it serves.
func TestHealthzNotServingWhenTheServiceIsNot(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	srv := startServer(t, cfg, nil)
	base := "http://" + srv.AdminAddr()
	if err := srv.SetServingStatus(context.Background(), cfg.Service, kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	if n := len(resolveOf(t, cfg, cfg.Service)); n != 0 {
		t.Fatalf("service not serving, yet %d instances registered", n)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "NOT_SERVING") {
		t.Errorf("/healthz with the service not serving (and out of the registry): %d %q; want 503 NOT_SERVING", code, body)
	}
	var sum struct {
		Status string `json:"status"`
	}
	getJSON(t, base+"/status/summary.json", &sum)
	if sum.Status != string(kernrpc.HealthNotServing) {
		t.Errorf("console summary status %q with the service not serving; want %s", sum.Status, kernrpc.HealthNotServing)
	}
	if err := srv.SetServingStatus(context.Background(), cfg.Service, kernrpc.HealthServing); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "SERVING" {
		t.Errorf("/healthz serving again: %d %q; want 200 SERVING", code, body)
	}
}
