package kernrpc_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// Two entries of one plugin are two plugins with options of their own:
// the plugins view must show each its own, not the first one's decoded
// under the second's (the console decodes the config's options over the
// factory's defaults, and must start from fresh defaults each time).
func TestConsolePluginsOfOneNameHaveTheirOwnOptions(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{
		{Name: "token-bucket", Side: "server", Methods: []string{"Echo.A"}, Options: map[string]any{"rate": 0.5, "burst": 7, "mode": "backoff"}},
		{Name: "token-bucket", Side: "server", Methods: []string{"Echo.B"}, Options: map[string]any{"rate": 2}},
	}
	srv := startServer(t, cfg, nil)
	var st consoleStatus
	getJSON(t, "http://"+srv.AdminAddr()+"/status.json", &st)
	var got []map[string]any
	for _, p := range st.Plugins {
		if p.Kind == "filter" && p.Name == "token-bucket" {
			got = append(got, p.Options)
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d token-bucket plugins in the view, want 2: %+v", len(got), st.Plugins)
	}
	want := []map[string]any{{"rate": 0.5, "burst": 7.0, "mode": "backoff"}, {"rate": 2.0, "burst": 100.0, "mode": "reject"}}
	for i, w := range want {
		for k, v := range w {
			if got[i][k] != v {
				t.Errorf("token-bucket #%d: %s = %v, want %v (options %v)", i+1, k, got[i][k], v, got[i])
			}
		}
	}
}

// stateFilter is a filter whose state report the console shows: readings
// JSON has no number for, or a report that panics.
type stateFilter struct{ panics bool }

func (stateFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f stateFilter) ReportState(emit func(kernel.Reading)) {
	emit(kernel.Reading{Name: "test_ratio", Kind: kernel.Gauge, Value: math.NaN()})
	emit(kernel.Reading{Name: "test_limit", Kind: kernel.Gauge, Value: math.Inf(1)})
	emit(kernel.Reading{Name: "test_floor", Kind: kernel.Gauge, Value: math.Inf(-1)})
	if f.panics {
		panic("report broken")
	}
}

func init() {
	for name, panics := range map[string]bool{"test-odd-state": false, "test-panicking-state": true} {
		kernel.RegisterFilter(kernel.NewFactory(name, "reports odd state", func() *sidedOptions { return &sidedOptions{} },
			func(*sidedOptions) (kernel.Filter, error) { return stateFilter{panics}, nil }))
	}
}

// The console must serve its JSON whatever a plugin reports: a reading
// that is NaN or infinite (which encoding/json refuses, failing the whole
// document) is written as Prometheus' HTTP API writes it, a string; a
// report that panics loses its own readings, not the views.
func TestConsoleStateOfOddReadings(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-odd-state"}, {Name: "test-panicking-state"}}
	srv := startServer(t, cfg, nil)
	for _, path := range []string{"/status.json", "/status/state.json"} {
		code, body := get(t, "http://"+srv.AdminAddr()+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		var v any
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
		for _, want := range []string{`"value": "NaN"`, `"value": "+Inf"`, `"value": "-Inf"`, `"error": "ReportState panicked: report broken"`} {
			if !strings.Contains(body, want) {
				t.Errorf("GET %s has no %s:\n%s", path, want, body)
			}
		}
	}
}
