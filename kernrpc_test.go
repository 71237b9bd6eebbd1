package kernrpc_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

// writeConfig writes content to a file called name in a fresh directory.
func writeConfig(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func init() {
	// The configs below name these: a config is checked against the
	// plugins it names when it is loaded.
	kernel.RegisterTransport(kernel.NewFactory("every-kind", "test: options of every kind", func() *everyKind { return &everyKind{} },
		func(*everyKind) (kernel.Transport, error) { return nil, errors.New("test only") }))
	kernel.RegisterFilter(kernel.NewFactory("rate-stub", "test: takes a rate", func() *struct {
		Rate int `json:"rate"`
	} {
		return &struct {
			Rate int `json:"rate"`
		}{}
	}, func(*struct {
		Rate int `json:"rate"`
	}) (kernel.Filter, error) {
		return nil, errors.New("test only")
	}))
}

// everyKind is what a plugin's options struct may hold; the transport's
// options block of the configs below decodes into it.
type everyKind struct {
	MaxFrameSize kernel.Size     `json:"max_frame_size"`
	ReadTimeout  kernel.Duration `json:"read_timeout"`
	Workers      int             `json:"workers"`
	Ratio        float64         `json:"ratio"`
	NoDelay      bool            `json:"no_delay"`
	Zones        []string        `json:"zones"`
	Limits       map[string]int  `json:"limits"`
	TLS          struct {
		Enabled bool   `json:"enabled"`
		CAFile  string `json:"ca_file"`
	} `json:"tls"`
	Optional *string `json:"optional"`
}

const yamlConfig = `
# every kind of value a config holds
service: echo
address: 127.0.0.1:7000
transport:
  name: every-kind
  options:
    max_frame_size: 4MiB
    read_timeout: 5s
    workers: 8
    ratio: 0.75
    no_delay: true
    zones: [eu-west-1a, eu-west-1b]
    limits: {Echo.Say: 100, Echo.Stream: 10}
    tls:
      enabled: false
      ca_file: /etc/ca.pem
    optional: null
codec: {name: protobuf}
registry:
  name: memory
  options:
    namespace: yaml-test
    default_ttl: 2s
    static:
      echo: ["10.0.0.1:7000", "10.0.0.2:7000"]
balancer: {name: round-robin}
filters:
  - {name: rate-stub, side: server, methods: ["Echo.*"], options: {rate: 1000}}
server:
  shutdown_timeout: 3s
  metadata: {zone: eu}
client:
  pool_size: 4
  timeout: 250ms
  retries: 0
`

const jsonConfig = `{
  "service": "echo",
  "address": "127.0.0.1:7000",
  "transport": {"name": "every-kind", "options": {
    "max_frame_size": "4MiB", "read_timeout": "5s", "workers": 8, "ratio": 0.75, "no_delay": true,
    "zones": ["eu-west-1a", "eu-west-1b"], "limits": {"Echo.Say": 100, "Echo.Stream": 10},
    "tls": {"enabled": false, "ca_file": "/etc/ca.pem"}, "optional": null}},
  "codec": {"name": "protobuf"},
  "registry": {"name": "memory", "options": {"namespace": "json-test", "default_ttl": "2s",
    "static": {"echo": ["10.0.0.1:7000", "10.0.0.2:7000"]}}},
  "balancer": {"name": "round-robin"},
  "filters": [{"name": "rate-stub", "side": "server", "methods": ["Echo.*"], "options": {"rate": 1000}}],
  "server": {"shutdown_timeout": "3s", "metadata": {"zone": "eu"}},
  "client": {"pool_size": 4, "timeout": "250ms", "retries": 0}
}`

func TestLoadConfigReadsEveryKindOfValue(t *testing.T) {
	for _, tc := range []struct{ file, content string }{
		{"kernrpc.yaml", yamlConfig},
		{"kernrpc.yml", yamlConfig},
		{"kernrpc.json", jsonConfig},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := writeConfig(t, tc.file, tc.content)
			cfg, err := kernrpc.LoadConfig(path)
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if cfg.Source != path {
				t.Errorf("Source = %q, want %q", cfg.Source, path)
			}
			if cfg.Service != "echo" || cfg.Address != "127.0.0.1:7000" {
				t.Errorf("service, address = %q, %q; want echo, 127.0.0.1:7000", cfg.Service, cfg.Address)
			}
			names := []string{cfg.Transport.Name, cfg.Codec.Name, cfg.Registry.Name, cfg.Balancer.Name}
			if want := []string{"every-kind", "protobuf", "memory", "round-robin"}; !slices.Equal(names, want) {
				t.Errorf("plugin names = %v, want %v", names, want)
			}
			if len(cfg.Filters) != 1 || cfg.Filters[0].Side != "server" || !slices.Equal(cfg.Filters[0].Methods, []string{"Echo.*"}) {
				t.Errorf("filters = %+v, want one server-side rate-stub on Echo.*", cfg.Filters)
			}
			if cfg.Server.ShutdownTimeout.D() != 3*time.Second || cfg.Server.Metadata["zone"] != "eu" {
				t.Errorf("server = %+v, want shutdown_timeout 3s and metadata zone=eu", cfg.Server)
			}
			if cfg.Client.PoolSize != 4 || cfg.Client.Timeout.D() != 250*time.Millisecond || *cfg.Client.Retries != 0 {
				t.Errorf("client = %+v (retries %d), want pool 4, timeout 250ms, retries 0", cfg.Client, *cfg.Client.Retries)
			}

			var opts everyKind
			if err := kernel.DecodeOptions(cfg.Transport.Options, &opts); err != nil {
				t.Fatalf("DecodeOptions(transport options): %v", err)
			}
			if opts.MaxFrameSize != 4<<20 || opts.ReadTimeout.D() != 5*time.Second || opts.Workers != 8 ||
				opts.Ratio != 0.75 || !opts.NoDelay || opts.TLS.Enabled || opts.TLS.CAFile != "/etc/ca.pem" || opts.Optional != nil {
				t.Errorf("decoded options = %+v", opts)
			}
			if !slices.Equal(opts.Zones, []string{"eu-west-1a", "eu-west-1b"}) {
				t.Errorf("zones = %v", opts.Zones)
			}
			if opts.Limits["Echo.Say"] != 100 || opts.Limits["Echo.Stream"] != 10 {
				t.Errorf("limits = %v", opts.Limits)
			}

			// The registry block builds the plugin it names.
			reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, cfg.Source)
			if err != nil {
				t.Fatalf("NewRegistry from the config: %v", err)
			}
			defer reg.Close()
			set, err := reg.Resolve(context.Background(), "echo")
			if err != nil || len(set) != 2 || set[1].Address != "10.0.0.2:7000" {
				t.Errorf("static instances from the config = %+v, %v; want 10.0.0.1:7000 and 10.0.0.2:7000", set, err)
			}
		})
	}
}

func TestEmptyConfigMeansDefaults(t *testing.T) {
	for _, tc := range []struct{ file, content string }{
		{"empty.yaml", ""},
		{"comments.yaml", "# nothing yet\n"},
		{"empty.json", "{}"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cfg, err := kernrpc.LoadConfig(writeConfig(t, tc.file, tc.content))
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if cfg.Registry.Name != kernrpc.DefaultRegistry || cfg.Transport.Name != kernrpc.DefaultTransport {
				t.Errorf("registry, transport = %q, %q; want the defaults", cfg.Registry.Name, cfg.Transport.Name)
			}
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	cases := []struct {
		name, file, content string
		want                []string // each must appear in the error, besides the file's path
	}{
		{"unknown top-level key is named", "k.yaml", "service: echo\nregistyr: {name: memory}\n", []string{`"registyr"`, "unknown key"}},
		{"unknown top-level key in JSON", "k.json", `{"servcie": "echo"}`, []string{`"servcie"`}},
		{"wrong type is named", "k.yaml", "service: [a, b]\n", []string{`"service"`, "wrong type", "string"}},
		{"wrong nested type is named", "k.yaml", "client: {pool_size: many}\n", []string{"pool_size", "integer"}},
		{"bad duration", "k.yaml", "client: {timeout: soon}\n", []string{`"soon"`, "5s"}},
		{"duplicate key in YAML", "k.yaml", "service: a\nservice: b\n", []string{`"service"`, "already defined"}},
		{"duplicate nested key in JSON", "k.json", `{"client": {"pool_size": 1, "pool_size": 2}}`, []string{`"client.pool_size"`, "twice"}},
		{"two YAML documents", "k.yaml", "service: a\n---\nservice: b\n", []string{"more than one YAML document"}},
		{"data after the JSON object", "k.json", `{"service": "a"} {"service": "b"}`, []string{"one JSON object"}},
		{"malformed JSON", "k.json", `{"service": }`, []string{"invalid character"}},
		{"top level is a list", "k.yaml", "- service: a\n", []string{"a list", "mapping"}},
		{"top level is not an object", "k.json", `["a"]`, []string{"not a JSON object"}},
		{"non-string key", "k.yaml", "server:\n  metadata: {1: one}\n", []string{"server.metadata", "quote it"}},
		{"unquoted timestamp", "k.yaml", "service: 2024-01-02\n", []string{`"service"`, "timestamp", "quote"}},
		{"infinite number", "k.yaml", "transport: {options: {ratio: .inf}}\n", []string{"transport.options.ratio"}},
		{"unknown extension", "k.toml", "service = 'a'\n", []string{".toml", ".yaml", ".json"}},
		{"invalid filter side", "k.yaml", "filters: [{name: f, side: left}]\n", []string{"filters[0].side", "left"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.file, tc.content)
			cfg, err := kernrpc.LoadConfig(path)
			if err == nil {
				t.Fatalf("LoadConfig succeeded with %+v; want an error", cfg)
			}
			for _, want := range append([]string{path}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %s", err, want)
				}
			}
		})
	}
}

func TestMissingFileSaysWhatToDo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nowhere", "kernrpc.yaml")
	_, err := kernrpc.LoadConfig(path)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LoadConfig of a missing file = %v, want an error wrapping fs.ErrNotExist", err)
	}
	for _, want := range []string{path, "-config", "examples/echo/kernrpc.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestEnvironmentExpansion(t *testing.T) {
	t.Setenv("KERNRPC_TEST_SERVICE", "echo-from-env")
	t.Setenv("KERNRPC_TEST_EMPTY", "")
	t.Setenv("KERNRPC_ADDRESS", "")
	path := writeConfig(t, "env.yaml", `
service: ${KERNRPC_TEST_SERVICE}
address: ${KERNRPC_TEST_UNSET:-0.0.0.0:9000}
advertise: ${KERNRPC_TEST_EMPTY:-fallback.example:9000}
registry: {name: memory, options: {namespace: "ns-${KERNRPC_TEST_SERVICE}"}}
`)
	cfg, err := kernrpc.LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	if cfg.Service != "echo-from-env" {
		t.Errorf("${VAR}: service = %q, want echo-from-env", cfg.Service)
	}
	if cfg.Address != "0.0.0.0:9000" {
		t.Errorf("${UNSET:-default}: address = %q, want 0.0.0.0:9000", cfg.Address)
	}
	if cfg.Advertise != "fallback.example:9000" {
		t.Errorf("${EMPTY:-default}: advertise = %q, want the default", cfg.Advertise)
	}
	if got := cfg.Registry.Options["namespace"]; got != "ns-echo-from-env" {
		t.Errorf("expansion inside plugin options: namespace = %v, want ns-echo-from-env", got)
	}

	unset := writeConfig(t, "unset.yaml", "service: ${KERNRPC_TEST_UNSET}\n")
	_, err = kernrpc.LoadConfig(unset)
	if err == nil || !strings.Contains(err.Error(), "KERNRPC_TEST_UNSET") || !strings.Contains(err.Error(), unset) {
		t.Errorf("an unset ${VAR} = %v, want an error naming KERNRPC_TEST_UNSET and the file", err)
	}
}

func TestAddressOverriddenByEnvironment(t *testing.T) {
	t.Setenv("KERNRPC_ADDRESS", "10.1.2.3:7777")
	t.Setenv("KERNRPC_ADVERTISE", "")
	for _, file := range []string{"a.yaml", "a.json"} {
		content := "address: 127.0.0.1:7000\n"
		if strings.HasSuffix(file, ".json") {
			content = `{"address": "127.0.0.1:7000"}`
		}
		cfg, err := kernrpc.LoadConfig(writeConfig(t, file, content))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if cfg.Address != "10.1.2.3:7777" {
			t.Errorf("%s: address = %q, want KERNRPC_ADDRESS 10.1.2.3:7777", file, cfg.Address)
		}
	}
}

func TestUnknownPluginIsNamedWithTheKnownOnesWhenLoaded(t *testing.T) {
	path := writeConfig(t, "nope.yaml", "registry: {name: nope}\ntransport: {name: nope}\n")
	_, err := kernrpc.LoadConfig(path)
	var unknown *kernel.UnknownPluginError
	if !errors.As(err, &unknown) {
		t.Fatalf("LoadConfig = %v, want a *kernel.UnknownPluginError: every name is checked when the config is loaded", err)
	}
	for _, want := range []string{
		"kernrpc: " + path + `: transport "nope": no transport of that name`,
		"kernrpc: " + path + `: registry "nope": no registry of that name`,
		"memory", "tcp-lv", "forgotten import",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Count(err.Error(), "kernrpc: "+path) != 2 {
		t.Errorf("error %q: want one line per unknown plugin", err)
	}
}

func TestUnknownPluginOptionIsNamedWhenLoaded(t *testing.T) {
	path := writeConfig(t, "bogus.yaml", "registry:\n  name: memory\n  options: {bogus: 1}\n")
	_, err := kernrpc.LoadConfig(path)
	var pe *kernel.PluginError
	if !errors.As(err, &pe) || pe.Name != "memory" || pe.Source != path || pe.Kind != kernel.KindRegistry {
		t.Fatalf("error = %#v, want a *kernel.PluginError for registry memory from %s", err, path)
	}
	want := "kernrpc: " + path + `: registry "memory": option "bogus": unknown key (known keys: `
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("error %q, want it to start %q and list namespace", err, want)
	}
}

func TestClientSidePluginsAreCheckedOnTheServerSideToo(t *testing.T) {
	path := writeConfig(t, "typo.yaml", "balancer: roundrobin\n")
	_, err := kernrpc.LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), `balancer "roundrobin": no balancer of that name is registered (known: `) || !strings.Contains(err.Error(), "round-robin") {
		t.Fatalf("LoadConfig = %v, want the misspelt balancer named with the known ones", err)
	}
}

func TestBarePluginNamesStandForNameBlocks(t *testing.T) {
	path := writeConfig(t, "bare.yaml", "transport: tcp-lv\ncodec: json\nregistry: memory\nbalancer: round-robin\n")
	cfg, err := kernrpc.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Transport.Name != "tcp-lv" || cfg.Codec.Name != "json" || cfg.Registry.Name != "memory" || cfg.Balancer.Name != "round-robin" {
		t.Errorf("config = %+v, want each bare name as the plugin's name", cfg)
	}
}

// FuzzParseConfig feeds arbitrary bytes through both config readers: a
// config file is input from outside, so any of it must end in a config or
// an error, never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("service: echo\ntransport: {name: tcp-lv, options: {max_frame_size: 4MiB}}\n"), true)
	f.Add([]byte("filters:\n  - {name: log, side: server, methods: [\"Echo.*\"]}\nclient: {timeout: ${T:-1s}}\n"), true)
	f.Add([]byte(`{"service":"echo","client":{"pool_size":2,"timeout":"2s"}}`), false)
	f.Add([]byte("a: &x [*x]\n"), true)
	f.Add([]byte("service: echo\n---\nservice: again\n"), true)
	f.Add([]byte("client: {timeout: 2026-01-02}\nserver: {shutdown_timeout: .nan}\n"), true)
	f.Add([]byte("{1: x, service: echo, service: twice}\n"), true)
	f.Add([]byte(`{"service":"echo","service":"twice"}`), false)
	f.Add([]byte(`{"transport":{"name":"tcp-lv","options":{"max_frame_size":"huge"}}} trailing`), false)
	f.Add([]byte(`{"filters":[{"name":"rate-stub","options":{"rate":1e400}}],"client":{"pool_size":-1}}`), false)
	f.Fuzz(func(t *testing.T, data []byte, yaml bool) {
		source := "fuzz.json"
		if yaml {
			source = "fuzz.yaml"
		}
		cfg, err := kernrpc.ParseConfig(data, source)
		if err == nil && cfg == nil {
			t.Fatal("no config and no error")
		}
		// A user with a broken config needs to know which file it is.
		if err != nil && !strings.Contains(err.Error(), source) {
			t.Fatalf("error does not name %s: %v", source, err)
		}
	})
}

// TestReadmeConfigExample keeps the README's config example true: it
// parses, and every plugin it names builds with the options it gives.
func TestReadmeConfigExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```yaml\n")
	if !ok {
		t.Fatal("README.md has no yaml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	cfg, err := kernrpc.ParseConfig([]byte(block), "README.md.yaml")
	if err != nil {
		t.Fatalf("README's config example: %v", err)
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatalf("README's config example does not build a server: %v", err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestCallOptions(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Meta", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			kernrpc.CallInfoFrom(ctx).SetResponseMetadata("seen", kernrpc.IncomingMetadata(ctx)["k"]+"/"+kernrpc.IncomingMetadata(ctx)["ctx"])
			if req.Text == "wait" {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"ctx": "c"})
	var got kernel.Metadata
	if err := cli.Call(ctx, "Echo.Meta", &echopb.Echo{}, &echopb.Echo{}, kernrpc.CallMetadata(kernel.Metadata{"k": "v"}), kernrpc.ReceiveMetadata(&got)); err != nil {
		t.Fatal(err)
	}
	if got["seen"] != "v/c" {
		t.Fatalf("server saw %q; want the option's metadata merged over the context's", got["seen"])
	}
	start := time.Now()
	err := cli.Call(context.Background(), "Echo.Meta", &echopb.Echo{Text: "wait"}, &echopb.Echo{}, kernrpc.CallTimeout(50*time.Millisecond))
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || time.Since(start) > 2*time.Second {
		t.Fatalf("call with CallTimeout(50ms) = %v after %v, want DeadlineExceeded soon", err, time.Since(start))
	}
}
