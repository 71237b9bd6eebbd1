package kernrpc

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-pass", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(ctx, info, req)
		}), nil
	}})
	kernel.RegisterFilter(kernel.NewFactory("test-seeded", "test: takes a seed", func() *seededOptions { return &seededOptions{} },
		func(*seededOptions) (kernel.Filter, error) {
			return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
				return next(ctx, info, req)
			}), nil
		}))
}

// seededOptions are the options of the test-seeded filter: a uint64, as
// the faulty transport's seed is.
type seededOptions struct {
	Seed uint64 `json:"seed"`
}

func TestParseTree(t *testing.T) {
	t.Setenv("ECHO_PORT", "7123")
	tree := map[string]any{
		"service":   "echo",
		"address":   "127.0.0.1:${ECHO_PORT}",
		"transport": map[string]any{"name": "tcp-lv", "options": map[string]any{"max_frame_size": "1MiB"}},
		"filters":   []any{map[string]any{"name": "test-pass", "side": "server", "methods": []any{"Echo.*"}}},
		"server":    map[string]any{"shutdown_timeout": "3s"},
		"client":    map[string]any{"pool_size": 2, "timeout": "${CALL_TIMEOUT:-750ms}"},
	}
	c, err := parseTree(tree, "echo.yaml")
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
	t.Setenv("KERNRPC_ADVERTISE", "10.1.2.3:9999")
	c, err := parseTree(map[string]any{"address": "127.0.0.1:1", "advertise": "192.0.2.1:1"}, "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Address != "127.0.0.1:9999" || c.Advertise != "10.1.2.3:9999" {
		t.Fatalf("address = %q, advertise = %q; want KERNRPC_ADDRESS and KERNRPC_ADVERTISE to win", c.Address, c.Advertise)
	}
}

func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		tree map[string]any
		want []string
	}{
		{"unknown top-level key", map[string]any{"transprot": map[string]any{"name": "tcp-lv"}}, []string{`"transprot"`, "unknown key", "svc.yaml", "transport"}},
		{"unknown nested key", map[string]any{"server": map[string]any{"shutdown_timeot": "5s"}},
			[]string{"svc.yaml", `key "server.shutdown_timeot"`, "unknown key (known keys: admin_address, drain_period, idle_timeout, instance_id,"}},
		{"unknown key of a filter", map[string]any{"filters": []any{"test-pass", map[string]any{"name": "test-pass", "sied": "client"}}},
			[]string{"svc.yaml", `key "filters[1].sied"`, "unknown key (known keys: methods, name, options, side, stage)"}},
		{"wrong type", map[string]any{"client": map[string]any{"pool_size": "two"}}, []string{"pool_size", "integer"}},
		{"pool size zero after explicit negative", map[string]any{"client": map[string]any{"pool_size": -1}}, []string{"client.pool_size", "at least 1"}},
		{"negative retries", map[string]any{"client": map[string]any{"retries": -1}}, []string{"client.retries"}},
		{"negative max pool size", map[string]any{"client": map[string]any{"max_pool_size": -2}}, []string{"client.max_pool_size", "negative, got -2"}},
		{"negative spread bytes", map[string]any{"client": map[string]any{"spread_bytes": -1}}, []string{"client.spread_bytes", "negative"}},
		{"bad filter side", map[string]any{"filters": []any{map[string]any{"name": "test-pass", "side": "middle"}}}, []string{"filters[0].side", `"middle"`}},
		{"filter without name", map[string]any{"filters": []any{map[string]any{"side": "client"}}}, []string{"filters[0].name"}},
		{"unset env var", map[string]any{"address": "${KERNRPC_TEST_SURELY_UNSET}"}, []string{"KERNRPC_TEST_SURELY_UNSET is not set"}},
		{"bad duration names key", map[string]any{"server": map[string]any{"shutdown_timeout": "later"}}, []string{`"server.shutdown_timeout"`, `bad duration "later"`}},
		{"duration without unit names key", map[string]any{"client": map[string]any{"timeout": 5}}, []string{`"client.timeout"`, "with a unit"}},
		{"negative client timeout", map[string]any{"client": map[string]any{"timeout": "-1s"}}, []string{"client.timeout", "must not be negative, got -1s"}},
		{"negative shutdown timeout", map[string]any{"server": map[string]any{"shutdown_timeout": "-2s"}}, []string{"server.shutdown_timeout", "must not be negative, got -2s"}},
		{"negative max connections", map[string]any{"server": map[string]any{"max_connections": -1}}, []string{"server.max_connections", "got -1 (0 means the default, 10000)"}},
		{"negative max concurrent calls", map[string]any{"server": map[string]any{"max_concurrent_calls": -5}}, []string{"server.max_concurrent_calls", "got -5 (0 means the default, 1024)"}},
		{"negative idle timeout", map[string]any{"server": map[string]any{"idle_timeout": "-1m"}}, []string{"server.idle_timeout", "(0 means the default, 15m)"}},
		{"negative dial timeout", map[string]any{"client": map[string]any{"dial_timeout": "-1s"}}, []string{"svc.yaml", "client.dial_timeout", "got -1s (0 means the default, 5s)"}},
		{"negative register ttl", map[string]any{"server": map[string]any{"register_ttl": "-1s"}}, []string{"svc.yaml", "server.register_ttl", "got -1s (0 means the default, 10s)"}},
		{"negative drain period", map[string]any{"server": map[string]any{"drain_period": "-1s"}}, []string{"server.drain_period", "must not be negative"}},
		{"stream window too small", map[string]any{"streams": map[string]any{"window": "512B"}}, []string{"streams.window", "at least 1KiB and below 2GiB"}},
		{"connection window below the stream's", map[string]any{"streams": map[string]any{"window": "4MiB", "connection_window": "1MiB"}}, []string{"streams.connection_window", "at least streams.window (4MiB)"}},
		{"bad filter stage", map[string]any{"filters": []any{map[string]any{"name": "test-pass", "stage": "later"}}}, []string{"filters[0].stage", `is "later"; want call or attempt`}},
		{"filter method pattern with an inner *", map[string]any{"filters": []any{map[string]any{"name": "test-pass", "methods": []any{"Echo.*", "Echo.*.Slow"}}}},
			[]string{"filters[0].methods[1]", `is "Echo.*.Slow": has a * before its end; a * may only end a pattern, as in "Echo.*"; leave methods out for every method`}},
		{"empty filter method pattern", map[string]any{"filters": []any{map[string]any{"name": "test-pass", "methods": []any{""}}}},
			[]string{"filters[0].methods[0]", `is "": names no method`}},
		{"stage on a server filter", map[string]any{"filters": []any{map[string]any{"name": "test-pass", "side": "server", "stage": "call"}}}, []string{"filters[0].stage", "stages are for client filters"}},
		{"unterminated env reference", map[string]any{"address": "${KERNRPC_ADDR"}, []string{"unterminated ${"}},
		{"window too large for any integer", map[string]any{"streams": map[string]any{"window": json.Number("99999999999999999999")}},
			[]string{`key "streams.window"`, "size 99999999999999999999 is over the largest a config may hold"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTree(tc.tree, "svc.yaml")
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

// A config built in code is checked as a loaded one is, when NewClient or
// NewServer takes it: values no config file can spell (a negative size)
// are refused there too.
func TestConfigBuiltInCodeIsChecked(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Service = "echo"
	cfg.Client.SpreadBytes = -1
	if _, err := NewClient(cfg, "echo"); err == nil || !strings.Contains(err.Error(), "client.spread_bytes must not be negative, got -1") {
		t.Errorf("NewClient with a negative spread_bytes: %v", err)
	}
	cfg = DefaultConfig()
	cfg.Server.MaxConnections = -1
	if _, err := NewServer(cfg); err == nil || !strings.Contains(err.Error(), "server.max_connections must be positive, got -1") {
		t.Errorf("NewServer with a negative max_connections: %v", err)
	}
}

// NewClient and NewServer decode each plugin's options once, while
// building, yet still report every bad plugin of the config at once, the
// other side's too, as loading the config does.
func TestNewClientAndServerReportEveryBadPlugin(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Service = "echo"
	cfg.Source = "svc.yaml"
	cfg.Codec.Options = map[string]any{"no_such_codec_option": true}
	cfg.Filters = []FilterConfig{
		{Name: "no-such-client-filter", Side: "client"},
		{Name: "no-such-server-filter", Side: "server"},
	}
	_, cerr := NewClient(cfg, "echo")
	_, serr := NewServer(cfg)
	for side, err := range map[string]error{"client": cerr, "server": serr} {
		if err == nil {
			t.Fatalf("%s: a config with three bad plugins was accepted", side)
		}
		for _, want := range []string{"svc.yaml", "no_such_codec_option", "no-such-client-filter", "no-such-server-filter"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error does not name %q:\n%v", side, want, err)
			}
		}
	}
}

// max_pool_size defaults to 2, and a pool_size above it is the limit, so
// that a larger pool_size alone never spreads calls further, and code that
// raises PoolSize on a DefaultConfig needs nothing else.
func TestMaxPoolSizeDefaults(t *testing.T) {
	for _, tc := range []struct {
		client     map[string]any
		wantMax    int
		wantSpread kernel.Size
	}{
		{map[string]any{}, DefaultMaxPoolSize, DefaultSpreadBytes},
		{map[string]any{"pool_size": 4}, 4, DefaultSpreadBytes},
		{map[string]any{"pool_size": 2, "max_pool_size": 6, "spread_bytes": "1MiB"}, 6, 1 << 20},
		{map[string]any{"pool_size": 3, "max_pool_size": 1}, 3, DefaultSpreadBytes},
	} {
		c, err := parseTree(map[string]any{"client": tc.client}, "svc.yaml")
		if err != nil {
			t.Fatalf("%v: %v", tc.client, err)
		}
		if c.Client.poolLimit() != tc.wantMax || c.Client.SpreadBytes != tc.wantSpread {
			t.Errorf("client %v: up to %d connections, spread_bytes %d; want %d, %d", tc.client, c.Client.poolLimit(), c.Client.SpreadBytes, tc.wantMax, tc.wantSpread)
		}
	}
}

// The largest window is one below 2GiB (credit travels below 2^31): the
// error for 2GiB itself must not say that 2GiB is allowed.
func TestStreamWindowOfTwoGiBIsRefusedForWhatItIs(t *testing.T) {
	for _, tc := range []struct {
		streams map[string]any
		want    string
	}{
		{map[string]any{"window": "2GiB"}, "streams.window must be at least 1KiB and below 2GiB, got 2GiB"},
		{map[string]any{"connection_window": "2GiB"}, "streams.connection_window must be at least streams.window (1MiB) and below 2GiB, got 2GiB"},
	} {
		_, err := parseTree(map[string]any{"streams": tc.streams}, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("streams %v: %v; want an error saying %q", tc.streams, err, tc.want)
		}
	}
	c, err := parseTree(map[string]any{"streams": map[string]any{"window": 1<<31 - 1, "connection_window": 1<<31 - 1}}, "svc.yaml")
	if err != nil || c.Streams.Window != 1<<31-1 {
		t.Errorf("the largest window: %v", err)
	}
}

// A stream window above the default connection window, given alone, is
// taken: the connection window it needs follows it, rather than failing on
// a key the config never wrote.
func TestALargeStreamWindowAloneRaisesTheConnectionWindow(t *testing.T) {
	c, err := parseTree(map[string]any{"streams": map[string]any{"window": "32MiB"}}, "svc.yaml")
	if err != nil {
		t.Fatalf("streams.window 32MiB alone: %v", err)
	}
	if c.Streams.Window != 32<<20 || c.Streams.ConnectionWindow != 32<<20 {
		t.Errorf("window %d, connection window %d; want 32MiB both", c.Streams.Window, c.Streams.ConnectionWindow)
	}
	if c, err = parseTree(map[string]any{"streams": map[string]any{"window": "4MiB"}}, "svc.yaml"); err != nil || c.Streams.ConnectionWindow != DefaultConnectionWindow {
		t.Errorf("streams.window 4MiB alone: connection window %d (%v); want the default, 16MiB", c.Streams.ConnectionWindow, err)
	}
}

// An environment reference that does not expand is named by its key's
// full path, list indices included, as every other config error is; a
// variable set to "" is not said to be unset.
func TestEnvironmentErrorsNameTheKey(t *testing.T) {
	t.Setenv("KERNRPC_TEST_EMPTY", "")
	for _, tc := range []struct {
		tree map[string]any
		want string
	}{
		{map[string]any{"filters": []any{"test-pass", map[string]any{"name": "${KERNRPC_TEST_SURELY_UNSET}"}}},
			`svc.yaml: key "filters[1].name": environment variable KERNRPC_TEST_SURELY_UNSET is not set`},
		{map[string]any{"transport": map[string]any{"name": "tcp-lv", "options": map[string]any{"tls": map[string]any{"ca_file": "${KERNRPC_TEST_SURELY_UNSET}"}}}},
			`svc.yaml: key "transport.options.tls.ca_file": environment variable KERNRPC_TEST_SURELY_UNSET is not set`},
		{map[string]any{"filters": []any{map[string]any{"name": "test-pass", "methods": []any{"Echo.*", "${KERNRPC_TEST_SURELY_UNSET"}}}},
			`svc.yaml: key "filters[0].methods[1]": unterminated ${`},
		{map[string]any{"address": "${KERNRPC_TEST_EMPTY}"},
			`svc.yaml: key "address": environment variable KERNRPC_TEST_EMPTY is empty`},
		{map[string]any{"address": "${KERNRPC_TEST_SURELY_UNSET:-${KERNRPC_TEST_EMPTY}}"},
			`svc.yaml: key "address": the default of ${KERNRPC_TEST_SURELY_UNSET:-...} holds a ${: a default is taken as written, it cannot name another variable`},
		{map[string]any{"address": "127.0.0.1:${}"},
			`svc.yaml: key "address": ${} names no environment variable`},
	} {
		_, err := parseTree(tc.tree, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error saying %q", tc.tree, err, tc.want)
		}
	}
}

// A ${VAR} gives a string: where a number or a boolean is wanted, the
// error says why the value written as one arrived as a string.
func TestEnvironmentGivesStrings(t *testing.T) {
	t.Setenv("KERNRPC_TEST_POOL", "4")
	for _, tc := range []struct {
		yaml, key string
	}{
		{"client:\n  pool_size: ${KERNRPC_TEST_POOL}\n", "client.pool_size"},
		{"server:\n  reflection: ${KERNRPC_TEST_FLAG:-true}\n", "server.reflection"},
		{"transport:\n  name: tcp-lv\n  options:\n    max_frame_size: ${KERNRPC_TEST_POOL}\n", ""},
		{"transport:\n  name: tcp-lv\n  options:\n    max_metadata_entries: ${KERNRPC_TEST_POOL}\n", "max_metadata_entries"},
	} {
		_, err := ParseConfig([]byte(tc.yaml), "svc.yaml")
		if tc.key == "" {
			if err != nil {
				t.Errorf("%q: %v; a size takes a string", tc.yaml, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), `"`+tc.key+`"`) || !strings.Contains(err.Error(), "a ${VAR} always gives a string") {
			t.Errorf("%q: %v; want the key named and the string explained", tc.yaml, err)
		}
	}
}

// A plugin's options reach it as the config file wrote them: an integer
// beyond 2^53, a seed say, is not rounded through a float64 on the way,
// whether the file is YAML or JSON.
func TestPluginOptionsKeepLargeIntegersExact(t *testing.T) {
	const seed = 9007199254740993 // 2^53 + 1: no float64 holds it
	for source, data := range map[string]string{
		"svc.yaml": "filters: [{name: test-seeded, options: {seed: 9007199254740993}}]\n",
		"svc.json": `{"filters": [{"name": "test-seeded", "options": {"seed": 9007199254740993}}]}`,
	} {
		c, err := ParseConfig([]byte(data), source)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		var opts seededOptions
		if err := kernel.DecodeOptions(c.Filters[0].Options, &opts); err != nil || opts.Seed != seed {
			t.Errorf("%s: the filter is given seed %d (%v); the file says %d", source, opts.Seed, err, uint64(seed))
		}
	}
}

// A file an editor saved with a byte order mark reads as one without,
// JSON as YAML.
func TestAByteOrderMarkIsIgnored(t *testing.T) {
	for source, data := range map[string]string{
		"svc.json": "\ufeff{\"service\": \"bom\"}",
		"svc.yaml": "\ufeffservice: bom\n",
	} {
		c, err := ParseConfig([]byte(data), source)
		if err != nil {
			t.Errorf("%s with a byte order mark: %v", source, err)
		} else if c.Service != "bom" {
			t.Errorf("%s with a byte order mark: service %q; want \"bom\"", source, c.Service)
		}
	}
}
