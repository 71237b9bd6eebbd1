package kernrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// The console's JSON, as a script reads it.
type consoleStatus struct {
	Summary struct {
		Service     string  `json:"service"`
		InstanceID  string  `json:"instance_id"`
		Status      string  `json:"status"`
		Calls       int64   `json:"calls"`
		Errors      int64   `json:"errors"`
		QPS         float64 `json:"qps"`
		Connections int     `json:"connections"`
		InFlight    int64   `json:"in_flight"`
	} `json:"summary"`
	Plugins []struct {
		Kind       string         `json:"kind"`
		Name       string         `json:"name"`
		Options    map[string]any `json:"options"`
		Configured []string       `json:"configured"`
		Reports    bool           `json:"reports_state"`
	} `json:"plugins"`
	Methods     []consoleMethod `json:"methods"`
	Connections []struct {
		Peer     string    `json:"peer"`
		Since    time.Time `json:"since"`
		InFlight int       `json:"in_flight"`
	} `json:"connections"`
	State []struct {
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		Readings []struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
			Value  float64           `json:"value"`
		} `json:"readings"`
	} `json:"state"`
	Instances struct {
		Self      string `json:"self"`
		Error     string `json:"error"`
		Instances []struct {
			ID      string `json:"id"`
			Address string `json:"address"`
		} `json:"instances"`
	} `json:"instances"`
	Slowest []struct {
		Method     string  `json:"method"`
		DurationMs float64 `json:"duration_ms"`
		Code       string  `json:"code"`
		Peer       string  `json:"peer"`
		TraceID    string  `json:"trace_id"`
	} `json:"slowest"`
}

type consoleMethod struct {
	Method      string           `json:"method"`
	Service     string           `json:"service"`
	Calls       int64            `json:"calls"`
	Errors      int64            `json:"errors"`
	Codes       map[string]int64 `json:"codes"`
	QPS         float64          `json:"qps"`
	P50         float64          `json:"p50_ms"`
	P99         float64          `json:"p99_ms"`
	WindowCalls int64            `json:"window_calls"`
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body := get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
}

const testTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"

// consoleServer starts a server with the console on, the echo methods, a
// failing one, a slow one and one behind a small token bucket.
func consoleServer(t testing.TB) (*kernrpc.Server, *kernrpc.Config) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	// The client-only filter is left out of the server; the token bucket's
	// view must still show its own options.
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-client-only", Options: map[string]any{"note": "for clients"}},
		{Name: "token-bucket", Side: "server", Methods: []string{"Echo.Limited"}, Options: map[string]any{"rate": 0.01, "burst": 3}}}
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Fail", func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
			return nil, kernel.Errorf(kernel.NotFound, "no such thing")
		})
		kernrpc.Handle(s, "Echo.Slow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			time.Sleep(30 * time.Millisecond)
			return req, nil
		})
		kernrpc.Handle(s, "Echo.Limited", echo)
	})
	cfg.Filters = nil // the client's
	return srv, cfg
}

func TestConsoleViewsAgreeWithCalls(t *testing.T) {
	srv, cfg := consoleServer(t)
	cli := newClient(t, cfg)
	ctx := context.Background()
	var resp echopb.Echo
	const okCalls, failCalls, unknownCalls, limitedCalls = 40, 7, 3, 5
	call := func(ctx context.Context, method string, n int) (failed int) {
		for range n {
			if err := cli.Call(ctx, method, &echopb.Echo{Text: "x"}, &resp); err != nil {
				failed++
			}
		}
		return failed
	}
	if n := call(ctx, "Echo.Echo", okCalls); n != 0 {
		t.Fatalf("%d echo calls failed", n)
	}
	if n := call(ctx, "Echo.Fail", failCalls); n != failCalls {
		t.Fatalf("%d of %d failing calls failed", n, failCalls)
	}
	call(ctx, "Echo.Nope", unknownCalls)
	if n := call(ctx, "Echo.Limited", limitedCalls); n != 2 {
		t.Fatalf("%d of the limited calls failed, want 2 (burst 3)", n)
	}
	traced := kernrpc.WithMetadata(ctx, kernel.Metadata{"traceparent": "00-" + testTraceID + "-00f067aa0ba902b7-01"})
	if n := call(traced, "Echo.Slow", 1); n != 0 {
		t.Fatal("the slow call failed")
	}

	base := "http://" + srv.AdminAddr()
	var st consoleStatus
	// A call is counted just after its answer is written, so the client
	// may ask before its last call is counted; it is once nothing is in
	// flight, since a call leaves the in-flight count after it is counted.
	eventually(2*time.Second, func() bool {
		st = consoleStatus{}
		getJSON(t, base+"/status.json", &st)
		return st.Summary.InFlight == 0
	})

	byName := map[string]consoleMethod{}
	for _, m := range st.Methods {
		byName[m.Method] = m
	}
	for _, want := range []consoleMethod{
		{Method: "Echo.Echo", Calls: okCalls, Codes: map[string]int64{"OK": okCalls}},
		{Method: "Echo.Fail", Calls: failCalls, Errors: failCalls, Codes: map[string]int64{"NotFound": failCalls}},
		{Method: "Echo.Limited", Calls: limitedCalls, Errors: 2, Codes: map[string]int64{"OK": 3, "ResourceExhausted": 2}},
		{Method: "Echo.Slow", Calls: 1, Codes: map[string]int64{"OK": 1}},
		{Method: "(not served here)", Calls: unknownCalls, Errors: unknownCalls, Codes: map[string]int64{"Unimplemented": unknownCalls}},
		{Method: kernrpc.HealthCheckMethod, Codes: map[string]int64{}},
	} {
		got, ok := byName[want.Method]
		if !ok {
			t.Errorf("methods.json has no %s: %+v", want.Method, st.Methods)
			continue
		}
		if got.Calls != want.Calls || got.Errors != want.Errors || !mapsEqual(got.Codes, want.Codes) {
			t.Errorf("%s: calls %d, errors %d, codes %v; want %d, %d, %v", want.Method, got.Calls, got.Errors, got.Codes, want.Calls, want.Errors, want.Codes)
		}
	}
	if m := byName["Echo.Slow"]; m.Service != "Echo" || m.P50 < 25 || m.P99 < 25 {
		t.Errorf("Echo.Slow: service %q, p50 %vms, p99 %vms; want Echo and about 30ms", m.Service, m.P50, m.P99)
	}
	total := int64(okCalls + failCalls + unknownCalls + limitedCalls + 1)
	if st.Summary.Calls != total || st.Summary.Errors != failCalls+unknownCalls+2 {
		t.Errorf("summary: %d calls, %d errors; want %d and %d", st.Summary.Calls, st.Summary.Errors, total, failCalls+unknownCalls+2)
	}
	if st.Summary.Service != "echo" || st.Summary.Status != "SERVING" || st.Summary.InstanceID != srv.Instance().ID {
		t.Errorf("summary: %+v", st.Summary)
	}

	if len(st.Slowest) == 0 || st.Slowest[0].Method != "Echo.Slow" || st.Slowest[0].DurationMs < 30 ||
		st.Slowest[0].TraceID != testTraceID || st.Slowest[0].Code != "OK" || st.Slowest[0].Peer == "" {
		t.Errorf("slowest: %+v; want Echo.Slow first, with its trace id", st.Slowest)
	}
	if len(st.Slowest) != 20 || slices.ContainsFunc(st.Slowest[1:], func(c struct {
		Method     string  `json:"method"`
		DurationMs float64 `json:"duration_ms"`
		Code       string  `json:"code"`
		Peer       string  `json:"peer"`
		TraceID    string  `json:"trace_id"`
	}) bool {
		return c.TraceID != ""
	}) {
		t.Errorf("slowest: %d calls (want 20), only the slow one traced: %+v", len(st.Slowest), st.Slowest)
	}

	if len(st.Connections) != 1 || st.Connections[0].Peer == "" || time.Since(st.Connections[0].Since) > time.Minute || st.Connections[0].InFlight != 0 {
		t.Errorf("connections: %+v; want the client's one", st.Connections)
	}
	if st.Summary.Connections != 1 {
		t.Errorf("summary: %d connections, want 1", st.Summary.Connections)
	}

	readings := map[string]float64{}
	for _, s := range st.State {
		for _, r := range s.Readings {
			readings[s.Kind+" "+s.Name+" "+r.Name] = r.Value
		}
	}
	for key, want := range map[string]float64{
		"engine kernrpc server_connections_open":          1,
		"engine kernrpc server_serving":                   1,
		"filter token-bucket token_bucket_rejected_total": 2,
	} {
		if got, ok := readings[key]; !ok || got != want {
			t.Errorf("state %s = %v (reported: %v), want %v", key, got, ok, want)
		}
	}

	plugins := map[string]int{}
	for i, p := range st.Plugins {
		plugins[p.Kind+" "+p.Name] = i
	}
	tr, ok := plugins["transport tcp-lv"]
	if !ok {
		t.Fatalf("plugins: %+v; want transport tcp-lv", st.Plugins)
	}
	if p := st.Plugins[tr]; p.Options["keepalive_interval"] != "100ms" || !slices.Equal(p.Configured, []string{"keepalive_interval", "keepalive_timeout"}) || len(p.Options) <= 2 {
		t.Errorf("tcp-lv: options %v, configured %v; want the configured keepalive over every default", p.Options, p.Configured)
	}
	if i, ok := plugins["filter token-bucket"]; !ok || st.Plugins[i].Options["burst"] != 3.0 || st.Plugins[i].Options["mode"] != "reject" || !st.Plugins[i].Reports {
		t.Errorf("token-bucket: %+v; want burst 3 from the config, mode reject by default, reporting state", st.Plugins)
	}
	if _, ok := plugins["codec protobuf"]; !ok {
		t.Errorf("plugins: no codec protobuf: %+v", st.Plugins)
	}

	if st.Instances.Self != srv.Instance().ID || len(st.Instances.Instances) != 1 || st.Instances.Instances[0].ID != srv.Instance().ID ||
		st.Instances.Instances[0].Address != srv.Addr() || st.Instances.Error != "" {
		t.Errorf("instances: %+v; want this server's one", st.Instances)
	}

	// Each view alone says what /status.json says of it.
	var methods []consoleMethod
	getJSON(t, base+"/status/methods.json", &methods)
	if len(methods) != len(st.Methods) {
		t.Errorf("methods.json: %d methods, status.json %d", len(methods), len(st.Methods))
	}
	var whole map[string]json.RawMessage
	getJSON(t, base+"/status.json", &whole)
	for name := range whole {
		var v any
		getJSON(t, base+"/status/"+name+".json", &v)
	}
	if len(whole) != 7 {
		t.Errorf("status.json has sections %v", slices.Sorted(mapsKeys(whole)))
	}

	// The rate window counts whole seconds: within two, the calls show.
	deadline := time.Now().Add(3 * time.Second)
	for {
		getJSON(t, base+"/status/methods.json", &methods)
		i := slices.IndexFunc(methods, func(m consoleMethod) bool { return m.Method == "Echo.Echo" })
		if i >= 0 && methods[i].WindowCalls == okCalls && methods[i].QPS > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Echo.Echo in the rate window: %+v; want %d calls and a QPS", methods[i], okCalls)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestConsolePageAndErrors(t *testing.T) {
	srv, _ := consoleServer(t)
	base := "http://" + srv.AdminAddr()
	code, body := get(t, base+"/status")
	if code != 200 || !strings.Contains(body, `id="total-calls"`) || strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Errorf("/status: %d; want the page, with no external asset:\n%.300s", code, body)
	}
	code, body = get(t, base+"/status/nosuch.json")
	if code != http.StatusNotFound || !strings.Contains(body, "/status/methods.json") {
		t.Errorf("/status/nosuch.json: %d %q; want 404 listing the views", code, body)
	}
	if _, body := get(t, base+"/"); !strings.Contains(body, "GET /status/slowest.json") || !strings.Contains(body, "GET /status") {
		t.Errorf("the admin index does not list the console:\n%s", body)
	}
}

// statusPage is a filter claiming the console's page.
type statusPage struct{ pagedFilter }

func (statusPage) AdminRoutes() []kernel.AdminRoute {
	return []kernel.AdminRoute{{Pattern: "GET /status", Handler: http.NotFoundHandler()}}
}

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-console-broken", New: func(any) (kernel.Registry, error) {
		return enginetest.FixedRegistry{Err: errors.New("registry unreachable")}, nil
	}})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-console-clash", New: func(any) (kernel.Filter, error) { return statusPage{}, nil }})
}

func TestConsoleRegistryError(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry = kernrpc.PluginConfig{Name: "test-console-broken"}
	cfg.Server.AdminAddress = "127.0.0.1:0"
	srv := startServer(t, cfg, nil)
	var st consoleStatus
	getJSON(t, "http://"+srv.AdminAddr()+"/status/instances.json", &st.Instances)
	if !strings.Contains(st.Instances.Error, "registry unreachable") || len(st.Instances.Instances) != 0 {
		t.Errorf("instances with a registry that fails: %+v; want its error", st.Instances)
	}
}

func TestConsoleRouteClash(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-console-clash", Side: "server"}}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), `filter "test-console-clash": route "GET /status"`) {
		t.Errorf("Start: %v; want the clash with the console named", err)
	}
	_ = srv.Shutdown(context.Background())
}

// adminRoutes is a filter offering the admin routes it holds.
type adminRoutes struct {
	pagedFilter
	routes []kernel.AdminRoute
}

func (a adminRoutes) AdminRoutes() []kernel.AdminRoute { return a.routes }

func init() {
	for name, r := range map[string]kernel.AdminRoute{
		"test-admin-nil-handler": {Pattern: "GET /mine", Handler: nil},
		"test-admin-bad-pattern": {Pattern: "GET mine", Handler: http.NotFoundHandler()},
	} {
		kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: name, New: func(any) (kernel.Filter, error) {
			return adminRoutes{routes: []kernel.AdminRoute{r}}, nil
		}})
	}
}

// A plugin's admin route that cannot be served (no handler, a pattern
// net/http refuses) fails Start with the plugin and route named, rather
// than panicking in net/http.
func TestAdminRouteThatCannotBeServed(t *testing.T) {
	for name, want := range map[string]string{
		"test-admin-nil-handler": `filter "test-admin-nil-handler": route "GET /mine": no handler`,
		"test-admin-bad-pattern": `filter "test-admin-bad-pattern": route "GET mine": `,
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Server.AdminAddress = "127.0.0.1:0"
			cfg.Filters = []kernrpc.FilterConfig{{Name: name, Side: "server"}}
			srv, err := kernrpc.NewServer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = srv.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), "server.admin_address") || !strings.Contains(err.Error(), want) {
				t.Errorf("Start: %v; want an error containing %q", err, want)
			}
			_ = srv.Shutdown(context.Background())
		})
	}
}

// TestConsoleDocExample checks the example of /status.json in
// docs/console.md against the real output: the same keys, no more, no
// fewer (free-form maps aside).
func TestConsoleDocExample(t *testing.T) {
	doc, err := os.ReadFile("docs/console.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- example: /status.json -->\\s*```json\n(.*?)\n```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/console.md has no ```json block after <!-- example: /status.json -->")
	}
	y := regexp.MustCompile("(?s)<!-- example: config -->\\s*```yaml\n(.*?)\n```").FindSubmatch(doc)
	if y == nil {
		t.Fatal("docs/console.md has no ```yaml block after <!-- example: config -->")
	}
	if cfg, err := kernrpc.ParseConfig(y[1], "docs/console.md.yaml"); err != nil || cfg.Server.AdminAddress != "127.0.0.1:9464" {
		t.Errorf("docs/console.md's config: %v; want server.admin_address 127.0.0.1:9464", err)
	}
	var example any
	if err := json.Unmarshal(m[1], &example); err != nil {
		t.Fatalf("docs/console.md: the example is not JSON: %v", err)
	}
	srv, cfg := consoleServer(t)
	cli := newClient(t, cfg)
	var resp echopb.Echo
	ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"traceparent": "00-" + testTraceID + "-00f067aa0ba902b7-01"})
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &resp); err != nil {
		t.Fatal(err)
	}
	// The server records a call after writing its answer, so the client
	// can ask before the call is in the page.
	var real any
	eventually(5*time.Second, func() bool {
		real = nil
		getJSON(t, "http://"+srv.AdminAddr()+"/status.json", &real)
		slow, _ := real.(map[string]any)["slowest"].([]any)
		return len(slow) > 0
	})
	docKeys, realKeys := map[string]bool{}, map[string]bool{}
	jsonKeys(example, "", docKeys)
	jsonKeys(real, "", realKeys)
	// Keys only some outputs have (omitted when empty).
	optional := map[string]bool{"plugins[].error": true, "plugins[].routes": true, "instances.error": true,
		"instances.instances[].load_updated": true, "plugins[].doc": true}
	for k := range docKeys {
		if !realKeys[k] && !optional[k] {
			t.Errorf("docs/console.md shows %s, which /status.json does not have", k)
		}
	}
	for k := range realKeys {
		if !docKeys[k] {
			t.Errorf("/status.json has %s, which docs/console.md's example does not show", k)
		}
	}
}

// freeForm are the maps whose keys are data, not names.
var freeForm = regexp.MustCompile(`(^|\.)(codes|labels|metadata|options)$`)

func jsonKeys(v any, path string, out map[string]bool) {
	switch t := v.(type) {
	case map[string]any:
		if freeForm.MatchString(path) {
			return
		}
		for k, e := range t {
			p := k
			if path != "" {
				p = path + "." + k
			}
			out[p] = true
			jsonKeys(e, p, out)
		}
	case []any:
		for _, e := range t {
			jsonKeys(e, path+"[]", out)
		}
	}
}

// BenchmarkConsoleOnCallPath is BenchmarkPipeline's server=inproc case
// without filters, with the console off and on: what counting the calls
// costs (allocs/op counts both sides).
func BenchmarkConsoleOnCallPath(b *testing.B) {
	for _, on := range []bool{false, true} {
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("console=%v/callers=%d", on, callers), func(b *testing.B) {
				cfg := testConfig(b)
				if on {
					cfg.Server.AdminAddress = "127.0.0.1:0"
				}
				startServer(b, cfg, nil)
				benchEcho16(b, newClient(b, cfg), callers)
			})
		}
	}
}

// Streams are calls of their methods too: a stream method's row must not
// read 0 calls while its streams run and end.
func TestConsoleCountsStreams(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	srv := startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(method, text string) error {
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, method, &echopb.Echo{Text: text})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	const okStreams = 4
	for range okStreams {
		if err := open("Count.Up", "3"); err != nil {
			t.Fatal(err)
		}
	}
	if err := open("Count.Up", "not a count"); kernel.CodeOf(err) != kernel.InvalidArgument {
		t.Fatalf("a stream asking for no count: %v, want InvalidArgument", err)
	}
	if err := open("Count.Nope", "1"); kernel.CodeOf(err) != kernel.Unimplemented {
		t.Fatalf("a stream of an unknown method: %v, want Unimplemented", err)
	}

	base := "http://" + srv.AdminAddr()
	var st consoleStatus
	eventually(2*time.Second, func() bool {
		st = consoleStatus{}
		getJSON(t, base+"/status.json", &st)
		return st.Summary.InFlight == 0
	})
	byName := map[string]consoleMethod{}
	for _, m := range st.Methods {
		byName[m.Method] = m
	}
	for _, want := range []consoleMethod{
		{Method: "Count.Up", Calls: okStreams + 1, Errors: 1, Codes: map[string]int64{"OK": okStreams, "InvalidArgument": 1}},
		{Method: "(not served here)", Calls: 1, Errors: 1, Codes: map[string]int64{"Unimplemented": 1}},
	} {
		got := byName[want.Method]
		if got.Calls != want.Calls || got.Errors != want.Errors || !mapsEqual(got.Codes, want.Codes) {
			t.Errorf("%s: calls %d, errors %d, codes %v; want %d, %d, %v", want.Method, got.Calls, got.Errors, got.Codes, want.Calls, want.Errors, want.Codes)
		}
	}
	if st.Summary.Calls != okStreams+2 || st.Summary.Errors != 2 {
		t.Errorf("summary: %d calls, %d errors; want %d and 2", st.Summary.Calls, st.Summary.Errors, okStreams+2)
	}
}
