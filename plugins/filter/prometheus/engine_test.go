package prometheus_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/prometheus"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, prometheus.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"max_methods": 8, "native_histograms": true},
		BadOptions:    map[string]any{"max_methods": 0},
		BadOptionsKey: "max_methods",
	})
}

// echoService serves Echo.Say, which answers "hello, " + the request,
// Echo.Fail, which fails with FailedPrecondition, and the stream Echo.Chat
// (chatHandler), and what more registers, through the filter configured
// on both sides. It returns a client and the two sides' filters.
func echoService(t *testing.T, yaml string, more ...func(*kernrpc.Server)) (*kernrpc.Server, *kernrpc.Client, *prometheus.Filter, *prometheus.Filter) {
	t.Helper()
	cfg, err := kernrpc.ParseConfig([]byte(strings.ReplaceAll(yaml, "NS", t.Name())), "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Say", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("hello, " + req.GetValue()), nil
	})
	kernrpc.Handle(srv, "Echo.Fail", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return nil, kernel.Errorf(kernel.FailedPrecondition, "not now")
	})
	chatHandler(srv)
	for _, register := range more {
		register(srv)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	sf, ok := kernrpc.FindPlugin[*prometheus.Filter](srv.Plugins(), prometheus.Name)
	cf, ok2 := kernrpc.FindPlugin[*prometheus.Filter](cli.Plugins(), prometheus.Name)
	if !ok || !ok2 {
		t.Fatalf("the server (%v) or the client (%v) built no prometheus filter", ok, ok2)
	}
	return srv, cli, sf, cf
}

const echoYAML = `
service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: "prometheus/NS"}}
client: {timeout: 5s}
filters:
  - name: prometheus
`

// burst makes n calls of Echo.Say and n of Echo.Fail from 8 goroutines,
// returning the bytes of the requests and of the responses.
func burst(t *testing.T, cli *kernrpc.Client, n int) (reqBytes, respBytes int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				req := wrapperspb.String(strings.Repeat("x", i%40))
				var resp wrapperspb.StringValue
				if err := cli.Call(context.Background(), "Echo.Say", req, &resp); err != nil {
					t.Errorf("Echo.Say: %v", err)
					return
				}
				err := cli.Call(context.Background(), "Echo.Fail", req, &wrapperspb.StringValue{})
				if kernel.CodeOf(err) != kernel.FailedPrecondition {
					t.Errorf("Echo.Fail: %v, want FailedPrecondition", err)
				}
				mu.Lock()
				reqBytes += 2 * proto.Size(req)
				respBytes += proto.Size(&resp)
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	return reqBytes, respBytes
}

// After a burst of N calls of each method through real servers and
// clients, each side's /metrics shows N calls per method and code, N
// observations in the latency histogram, nothing in flight, the bytes the
// messages took (the server's answers' from CallEnded), and passes
// promtool check metrics.
func TestBurstOverTheEngine(t *testing.T) {
	const n = 200
	_, cli, sf, cf := echoService(t, echoYAML)
	reqBytes, respBytes := burst(t, cli, n)

	for _, side := range []struct {
		name   string
		filter *prometheus.Filter
	}{{"server", sf}, {"client", cf}} {
		t.Run(side.name, func(t *testing.T) {
			url := serve(t, side.filter.Handler())
			body, fams := scrape(t, url)
			p := "kernrpc_" + side.name + "_"
			if side.name == "server" {
				body, fams = scrapeAnswered(t, url, 2*n)
			}
			for _, c := range []struct{ method, code string }{{"Say", "OK"}, {"Fail", "FailedPrecondition"}} {
				if got := value(t, fams, p+"calls_total", labels{"service": "Echo", "method": c.method, "code": c.code}); got != n {
					t.Errorf("%s calls of Echo.%s with %s: %g, want %d", side.name, c.method, c.code, got, n)
				}
				m := labels{"service": "Echo", "method": c.method}
				checkHistogram(t, fams, p+"call_duration_seconds", m, n)
				if got := value(t, fams, p+"calls_in_flight", m); got != 0 {
					t.Errorf("%s in flight after the burst: %g", side.name, got)
				}
			}
			if got := len(fams[p+"calls_total"].GetMetric()); got != 2 {
				t.Errorf("%d %scalls_total series, want 2 (one method and code each)", got, p)
			}
			var gotReq float64
			for _, m := range fams[p+"request_bytes_total"].GetMetric() {
				gotReq += m.GetCounter().GetValue()
			}
			if gotReq != float64(reqBytes) {
				t.Errorf("%s request bytes %g, want %d", side.name, gotReq, reqBytes)
			}
			if got := value(t, fams, p+"response_bytes_total", labels{"method": "Say"}); got != float64(respBytes) {
				t.Errorf("%s response bytes %g, want %d", side.name, got, respBytes)
			}
			if got := value(t, fams, p+"response_bytes_total", labels{"method": "Fail"}); got != 0 {
				t.Errorf("%s response bytes of failed calls %g, want 0: an error answer has no payload", side.name, got)
			}
			if side.name == "client" {
				if got := value(t, fams, p+"attempts_total", labels{"method": "Say"}); got != n {
					t.Errorf("client attempts of Echo.Say %g, want %d (one each)", got, n)
				}
			}
			promtool(t, body)
		})
	}
}

// scrapeAnswered scrapes a server's url until it counts n calls answered,
// for up to 5s: the server counts a call, with its answer's size, once
// the answer is written (CallEnded), which may be just after the client
// read it.
func scrapeAnswered(t *testing.T, url string, n int) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	return scrapeUntil(t, url, func(fams map[string]*dto.MetricFamily) bool {
		return sumOf(fams, "kernrpc_server_calls_total", labels{}) >= float64(n)
	})
}

// scrapeUntil scrapes url until done holds of the families, for up to
// 5s: the server counts a call just after its answer is written.
func scrapeUntil(t *testing.T, url string, done func(map[string]*dto.MetricFamily) bool) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		body, fams := scrape(t, url)
		if done(fams) || time.Now().After(deadline) {
			return body, fams
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The server mounts the filter's /metrics on its admin address.
func TestServedOnTheAdminAddress(t *testing.T) {
	srv, cli, _, _ := echoService(t, echoYAML+"server: {admin_address: 127.0.0.1:0}\n")
	burst(t, cli, 10)
	admin, ok := any(srv).(interface{ AdminAddr() string })
	if !ok || admin.AdminAddr() == "" {
		t.Fatal("the server serves no admin address")
	}
	body, fams := scrapeAnswered(t, "http://"+admin.AdminAddr()+"/metrics", 2*10)
	if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": "Say", "code": "OK"}); got != 10 {
		t.Errorf("%g calls on the admin address, want 10", got)
	}
	if _, ok := fams["kernrpc_client_calls_total"]; ok {
		t.Error("the server's page shows the client's calls, though registry: own keeps them apart")
	}
	promtool(t, body)
}

// With registry: default the server's and the client's filters share
// client_golang's default registry: one page shows both sides, and the
// second filter built reuses the families the first registered.
func TestDefaultRegistry(t *testing.T) {
	_, cli, sf, cf := echoService(t, strings.Replace(echoYAML, "  - name: prometheus\n", "  - name: prometheus\n    options: {registry: default}\n", 1))
	if sf.Gatherer() != cf.Gatherer() || sf.Registerer() != cf.Registerer() {
		t.Fatal("the two filters use different registries with registry: default")
	}
	url := serve(t, sf.Handler())
	// The default registry lives as long as the test binary (go test
	// -count=2 runs this twice): compare before and after.
	calls := func(fams map[string]*dto.MetricFamily, name string) float64 {
		if _, ok := fams[name]; !ok {
			return 0
		}
		return value(t, fams, name, labels{"method": "Say", "code": "OK"})
	}
	_, before := scrape(t, url)
	burst(t, cli, 10)
	// The server counts Say's last answers just after writing them.
	_, after := scrapeUntil(t, url, func(fams map[string]*dto.MetricFamily) bool {
		return calls(fams, "kernrpc_server_calls_total")-calls(before, "kernrpc_server_calls_total") >= 10
	})
	for _, name := range []string{"kernrpc_server_calls_total", "kernrpc_client_calls_total"} {
		if got := calls(after, name) - calls(before, name); got != 10 {
			t.Errorf("%s grew by %g on the server's page, want 10", name, got)
		}
	}
}
