package kernrpc_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	_ "github.com/kernrpc/kernrpc/plugins/filter/auth"
)

// The console's plugins view must not hand out the credentials a config
// gives the auth filter: anyone who can read the admin address (a scraper
// of /metrics, say) could then call the service.
func TestConsoleHidesAuthSecrets(t *testing.T) {
	const token = "static-bearer-token-do-not-leak"
	const key = "hmac-key-0123456789abcdefghijklmnopqrstuv"
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "auth", Side: "server", Options: map[string]any{
		"tokens": []any{token},
		"keys":   map[string]any{"k1": key},
	}}}
	srv := startServer(t, cfg, nil)
	for _, path := range []string{"/status/plugins.json", "/status.json"} {
		code, body := get(t, "http://"+srv.AdminAddr()+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if !strings.Contains(body, `"k1": "(hidden)"`) {
			t.Errorf("GET %s does not show key k1 as set and hidden", path)
		}
		for _, secret := range []string{token, key} {
			if strings.Contains(body, secret) {
				t.Errorf("GET %s serves the secret %q:\n%s", path, secret, body)
			}
		}
	}
}
