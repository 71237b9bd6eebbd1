package etcd_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// optionKey is the option a config error names: the kernel's decoding
// key, or the one the plugin's own message gives as option "KEY".
func optionKey(err error) string {
	var pe *kernel.PluginError
	if errors.As(err, &pe) && pe.Key != "" {
		return pe.Key
	}
	if k := kernel.OptionKey(err); k != "" {
		return k
	}
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, `option "`); ok {
		k, _, _ := strings.Cut(after, `"`)
		return k
	}
	return ""
}

func TestBadOptionsNameTheOption(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		options map[string]any
		key     string
		says    string
	}{
		{"endpoints empty", map[string]any{"endpoints": []any{}}, "endpoints", "empty"},
		{"an endpoint empty", map[string]any{"endpoints": []any{"127.0.0.1:2379", " "}}, "endpoints", "endpoint 1 is empty"},
		{"endpoints not a list", map[string]any{"endpoints": "127.0.0.1:2379"}, "endpoints", "want a list"},
		{"dial_timeout zero", map[string]any{"dial_timeout": "0s"}, "dial_timeout", "must be positive"},
		{"dial_timeout negative", map[string]any{"dial_timeout": "-1s"}, "dial_timeout", "must be positive"},
		{"dial_timeout without unit", map[string]any{"dial_timeout": 5}, "dial_timeout", "unit"},
		{"ttl zero", map[string]any{"ttl": "0s"}, "ttl", "must be positive"},
		{"ttl not a duration", map[string]any{"ttl": "ten seconds"}, "ttl", "bad duration"},
		{"load_report_interval zero", map[string]any{"load_report_interval": "0s"}, "load_report_interval", "must be positive"},
		{"prefix empty", map[string]any{"prefix": ""}, "prefix", "empty"},
		{"election_prefix empty", map[string]any{"election_prefix": ""}, "election_prefix", "empty"},
		{"election_prefix under prefix", map[string]any{"prefix": "/a/", "election_prefix": "/a/elections/"}, "election_prefix", "overlap"},
		{"shared_prefix empty", map[string]any{"shared_prefix": ""}, "shared_prefix", "empty"},
		{"shared_prefix over prefix", map[string]any{"prefix": "/a/services/", "shared_prefix": "/a/"}, "shared_prefix", "overlap"},
		{"shared_prefix under election_prefix", map[string]any{"election_prefix": "/e/", "shared_prefix": "/e/shared/"}, "shared_prefix", "overlap"},
		{"username without password", map[string]any{"username": "root"}, "username", "both or neither"},
		{"password without username", map[string]any{"password": "secret"}, "username", "both or neither"},
		{"tls cert without key", map[string]any{"tls": map[string]any{"cert_file": notPEM}}, "tls", "cert_file and key_file go together"},
		{"tls ca_file missing", map[string]any{"tls": map[string]any{"ca_file": filepath.Join(dir, "absent.pem")}}, "tls", "no such file"},
		{"tls ca_file not PEM", map[string]any{"tls": map[string]any{"ca_file": notPEM}}, "tls", "holds no PEM certificate"},
		{"tls key pair not PEM", map[string]any{"tls": map[string]any{"cert_file": notPEM, "key_file": notPEM}}, "tls", "cert_file"},
		// The kernel's decoding names a nested key with its parent, and
		// lists the keys of the mapping it is in as the known ones.
		{"tls unknown key", map[string]any{"tls": map[string]any{"ca": notPEM}}, "tls.ca", "unknown key (known keys: ca_file, cert_file"},
		{"unknown key", map[string]any{"endpoint": "127.0.0.1:2379"}, "endpoint", "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := kernel.NewRegistry(etcd.Name, tc.options, "svc.yaml")
			if err == nil {
				r.Close()
				t.Fatalf("NewRegistry(%v) succeeded; want an error naming option %q", tc.options, tc.key)
			}
			if got := optionKey(err); got != tc.key {
				t.Errorf("error %q names option %q; want %q", err, got, tc.key)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
			if !strings.Contains(err.Error(), "svc.yaml") || !strings.Contains(err.Error(), `registry "etcd"`) {
				t.Errorf("error %q does not name the file and the plugin", err)
			}
		})
	}
}

func TestDefaultsAreDocumented(t *testing.T) {
	o := etcd.DefaultOptions()
	if len(o.Endpoints) != 1 || o.Endpoints[0] != "127.0.0.1:2379" || o.DialTimeout.String() != "5s" || o.TTL.String() != "10s" ||
		o.Prefix != "/kernrpc/services/" || o.ElectionPrefix != "/kernrpc/elections/" || o.SharedPrefix != "/kernrpc/shared/" || o.LoadReportInterval.String() != "5s" || o.TLS != nil {
		t.Errorf("DefaultOptions() = %+v; the package doc and docs/registry-etcd.md list other defaults", *o)
	}
	// Every option key is in the package doc's list.
	doc, err := os.ReadFile("etcd.go")
	if err != nil {
		t.Fatal(err)
	}
	for key := range kernel.OptionFields(o) {
		if !strings.Contains(string(doc), "//\t    "+key+":") {
			t.Errorf("option %q is not listed in the package doc", key)
		}
	}
	for key := range kernel.OptionFields(etcd.TLSOptions{}) {
		if !strings.Contains(string(doc), "//\t      "+key+":") {
			t.Errorf("tls option %q is not listed in the package doc", key)
		}
	}
}

func TestPrefixGetsATrailingSlash(t *testing.T) {
	r, err := etcd.New(etcd.Options{
		Endpoints: []string{"127.0.0.1:1"}, DialTimeout: kernel.Duration(1e9), TTL: kernel.Duration(1e9),
		Prefix: "/svc", ElectionPrefix: "/elect", SharedPrefix: "/shared", LoadReportInterval: kernel.Duration(1e9),
	})
	if err != nil {
		t.Fatalf("New with prefixes lacking a trailing slash: %v; want them completed", err)
	}
	r.Close()
}
