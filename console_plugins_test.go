package kernrpc_test

import (
	"testing"

	"github.com/kernrpc/kernrpc"
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
