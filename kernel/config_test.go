package kernel

import (
	"encoding/json"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	t.Setenv("ECHO_PORT", "7123")
	tree := map[string]any{
		"service":   "echo",
		"address":   "127.0.0.1:${ECHO_PORT}",
		"transport": map[string]any{"name": "tcp-lv", "options": map[string]any{"max_frame_size": "1MiB"}},
		"filters":   []any{map[string]any{"name": "log", "side": "server", "methods": []any{"Echo.*"}}},
		"server":    map[string]any{"shutdown_timeout": "3s"},
		"client":    map[string]any{"pool_size": 2, "timeout": "${CALL_TIMEOUT:-750ms}"},
	}
	c, err := ParseConfig(tree, "echo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Address != "127.0.0.1:7123" {
		t.Errorf("address = %q, want the ${ECHO_PORT} expansion", c.Address)
	}
	if c.Client.Timeout.D() != 750*time.Millisecond || c.Client.PoolSize != 2 {
		t.Errorf("client = %+v", c.Client)
	}
	if c.Server.ShutdownTimeout.D() != 3*time.Second {
		t.Errorf("shutdown_timeout = %v", c.Server.ShutdownTimeout)
	}
	if c.Codec.Name != DefaultCodec || c.Registry.Name != DefaultRegistry || c.Balancer.Name != DefaultBalancer {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Transport.Options["max_frame_size"] != "1MiB" || c.Filters[0].Methods[0] != "Echo.*" {
		t.Errorf("plugin options lost: %+v %+v", c.Transport, c.Filters)
	}
}

func TestAddressEnvironmentOverride(t *testing.T) {
	t.Setenv("KERNRPC_ADDRESS", "127.0.0.1:9999")
	c, err := ParseConfig(map[string]any{"address": "127.0.0.1:1"}, "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Address != "127.0.0.1:9999" {
		t.Fatalf("address = %q, want KERNRPC_ADDRESS to win", c.Address)
	}
}

func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		tree map[string]any
		want []string
	}{
		{"unknown top-level key", map[string]any{"transprot": map[string]any{"name": "tcp-lv"}}, []string{`"transprot"`, "unknown key", "svc.yaml", "transport"}},
		{"wrong type", map[string]any{"client": map[string]any{"pool_size": "two"}}, []string{"pool_size", "integer"}},
		{"pool size zero after explicit negative", map[string]any{"client": map[string]any{"pool_size": -1}}, []string{"client.pool_size", "at least 1"}},
		{"negative retries", map[string]any{"client": map[string]any{"retries": -1}}, []string{"client.retries"}},
		{"bad filter side", map[string]any{"filters": []any{map[string]any{"name": "log", "side": "middle"}}}, []string{"filters[0].side", `"middle"`}},
		{"filter without name", map[string]any{"filters": []any{map[string]any{"side": "client"}}}, []string{"filters[0].name"}},
		{"unset env var", map[string]any{"address": "${KERNRPC_TEST_SURELY_UNSET}"}, []string{"KERNRPC_TEST_SURELY_UNSET is not set"}},
		{"bad duration names key", map[string]any{"server": map[string]any{"shutdown_timeout": "later"}}, []string{`"server.shutdown_timeout"`, `bad duration "later"`}},
		{"duration without unit names key", map[string]any{"client": map[string]any{"timeout": 5}}, []string{`"client.timeout"`, "with a unit"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.tree, "svc.yaml")
			if err == nil {
				t.Fatalf("no error; want one mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseConfigJSON(t *testing.T) {
	c, err := ParseConfigJSON([]byte(`{"service":"echo","codec":{"name":"json"}}`), "svc.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Service != "echo" || c.Codec.Name != "json" {
		t.Fatalf("got %+v", c)
	}
	for _, bad := range []string{`{"service":`, `{"service":"a"} {"service":"b"}`} {
		if _, err := ParseConfigJSON([]byte(bad), "svc.json"); err == nil || !strings.Contains(err.Error(), "svc.json") {
			t.Errorf("%s: err = %v, want an error naming the file", bad, err)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4KiB": 4096, "4 MiB": 4 << 20, "1GB": 1e9, "12B": 12} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "4XB", "1.5MiB", "99999999999GiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded; want an error", in)
		}
	}
}

func TestSizeAndDurationRoundTripThroughJSON(t *testing.T) {
	type opts struct {
		S Size     `json:"s"`
		D Duration `json:"d"`
	}
	for _, in := range []opts{{4 << 20, Duration(5 * time.Second)}, {65536, Duration(250 * time.Millisecond)}, {1000, 0}, {0, Duration(time.Hour)}} {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out opts
		if err := json.Unmarshal(b, &out); err != nil || out != in {
			t.Errorf("%+v -> %s -> %+v, %v", in, b, out, err)
		}
	}
	if b, _ := json.Marshal(Size(4 << 20)); string(b) != `"4MiB"` {
		t.Errorf("4 MiB marshals as %s, want \"4MiB\"", b)
	}
}

func TestOptionFieldsYieldsConfigKeysWithTheirTypes(t *testing.T) {
	type opts struct {
		Rate    int          `json:"rate"`
		Window  Duration     `json:"window,omitempty"`
		Logger  *slog.Logger `json:"-"`
		Plain   string
		private bool
		Any     any `json:"any"`
	}
	got := map[string]reflect.Type{}
	var order []string
	for k, typ := range OptionFields(&opts{}) {
		got[k] = typ
		order = append(order, k)
	}
	want := []string{"rate", "window", "Plain", "any"}
	if !slices.Equal(order, want) {
		t.Fatalf("keys = %v, want %v (json names, field order, without '-' and unexported fields)", order, want)
	}
	if got["window"] != reflect.TypeFor[Duration]() || got["any"].Kind() != reflect.Interface {
		t.Errorf("types = %v; want Duration for window and an interface for any", got)
	}
	for range OptionFields(42) {
		t.Fatal("a non-struct yielded a key")
	}
}
