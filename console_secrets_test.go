package kernrpc_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
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

// upstreamOptions are options with credentials in a list of rules and a
// map of them, as docs/plugins.md's rules[1].tries: each element's field
// tagged secret is as secret as one at the top.
type upstreamOptions struct {
	Rules []upstreamRule           `json:"rules"`
	Peers map[string]*upstreamPeer `json:"peers"`
}

type upstreamRule struct {
	Name  string `json:"name"`
	Token string `json:"token" secret:"true"`
}

type upstreamPeer struct {
	Password string `json:"password" secret:"true"`
}

// sharedRules are a plugin's default rules, shared by every value its
// defaults make, as a package-level list is.
var sharedRules = []upstreamRule{{Name: "default", Token: "default-token-do-not-leak"}}

func init() {
	kernel.RegisterFilter(kernel.NewFactory("test-nested-secrets", "holds credentials in lists and maps", func() *upstreamOptions { return &upstreamOptions{} },
		func(*upstreamOptions) (kernel.Filter, error) { return stateFilter{}, nil }))
	kernel.RegisterFilter(kernel.NewFactory("test-shared-secrets", "holds credentials in shared default rules", func() *upstreamOptions { return &upstreamOptions{Rules: sharedRules} },
		func(*upstreamOptions) (kernel.Filter, error) { return stateFilter{}, nil }))
}

// Secrets in lists and maps are hidden, and hiding them leaves alone the
// defaults the options shared: the next plugin built keeps its token.
func TestConsoleHidesSecretsInListsAndMaps(t *testing.T) {
	const token, password = "rule-token-do-not-leak", "peer-password-do-not-leak"
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-nested-secrets", Side: "server", Options: map[string]any{
		"rules": []any{map[string]any{"name": "first", "token": token}},
		"peers": map[string]any{"p1": map[string]any{"password": password}},
	}}, {Name: "test-shared-secrets", Side: "server"}}
	srv := startServer(t, cfg, nil)
	code, body := get(t, "http://"+srv.AdminAddr()+"/status/plugins.json")
	if code != http.StatusOK {
		t.Fatalf("GET /status/plugins.json: %d", code)
	}
	for _, secret := range []string{token, password, sharedRules[0].Token} {
		if strings.Contains(body, secret) {
			t.Errorf("the plugins view serves the secret %q", secret)
		}
	}
	if !strings.Contains(body, `"first"`) || strings.Count(body, `"(hidden)"`) != 3 {
		t.Errorf("want the rules' names shown and the three secrets as set and hidden:\n%s", body)
	}
	if sharedRules[0].Token != "default-token-do-not-leak" {
		t.Errorf("showing the options rewrote the defaults they shared: the default rule's token is now %q", sharedRules[0].Token)
	}
}
