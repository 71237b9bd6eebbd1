package prometheus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/filter/breaker"
	_ "github.com/kernrpc/kernrpc/plugins/filter/overload"
	"github.com/kernrpc/kernrpc/plugins/filter/prometheus"
	_ "github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
)

// governedYAML is echoYAML with every filter that reports its state, on
// the sides they are for, none of them refusing a call of burst: the
// scrapes the dashboard and the docs are checked against have every
// family.
const governedYAML = echoYAML + `  - {name: breaker, side: client, options: {share: registry}}
  - {name: breaker, side: client, methods: [Echo.Fail], options: {mode: sre}}
  - {name: token-bucket, options: {rate: 1000000, burst: 1000000}}
  - {name: overload, side: server}
`

// stateYAML configures, beside the prometheus filter, a breaker on the
// client, a token bucket of 2 calls for Echo.Limited on the server, and
// overload on the server.
const stateYAML = `
service: stateful
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: "prometheus/NS"}}
client: {timeout: 5s}
server: {admin_address: 127.0.0.1:0}
filters:
  - name: prometheus
  - {name: breaker, side: client, options: {min_requests: 4, open_duration: 1m}}
  - {name: token-bucket, side: server, methods: [Echo.Limited], options: {rate: 0.01, burst: 2}}
  - {name: overload, side: server}
`

// stateServer starts one server of stateYAML's service whose Echo.Say
// fails with Unavailable if failing, and whose Echo.Limited answers.
func stateServer(t *testing.T, cfg *kernrpc.Config, failing bool) *kernrpc.Server {
	t.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Say", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if failing {
			return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
		}
		return req, nil
	})
	kernrpc.Handle(srv, "Echo.Limited", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return req, nil
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}

func parseConfig(t *testing.T, yaml string) *kernrpc.Config {
	t.Helper()
	cfg, err := kernrpc.ParseConfig([]byte(strings.ReplaceAll(yaml, "NS", t.Name())), "state.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Two instances, one failing every Echo.Say: the client's page shows that
// instance's breaker open and the other's closed, and both instances;
// each server's page, on its admin address, shows its one connection, its
// token bucket's rejections, the calls it refused in
// kernrpc_server_calls_total (untimed) and its overload limit. Both pages
// pass promtool.
func TestStateOfThePluginsOverTheEngine(t *testing.T) {
	cfg := parseConfig(t, stateYAML)
	good, bad := stateServer(t, cfg, false), stateServer(t, cfg, true)
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	goodHost, badHost := good.Addr(), bad.Addr()

	ctx := context.Background()
	var unavailable, exhausted int
	for range 40 {
		if err := cli.Call(ctx, "Echo.Say", wrapperspb.String("x"), &wrapperspb.StringValue{}); kernel.CodeOf(err) == kernel.Unavailable {
			unavailable++
		}
	}
	for range 10 {
		if err := cli.Call(ctx, "Echo.Limited", wrapperspb.String("x"), &wrapperspb.StringValue{}); kernel.CodeOf(err) == kernel.ResourceExhausted {
			exhausted++
		}
	}
	if unavailable == 0 || exhausted == 0 {
		t.Fatalf("%d calls failed with Unavailable and %d with ResourceExhausted: the breaker and the bucket were not put to work", unavailable, exhausted)
	}

	cf, ok := kernrpc.FindPlugin[*prometheus.Filter](cli.Plugins(), prometheus.Name)
	if !ok {
		t.Fatal("the client built no prometheus filter")
	}
	body, fams := scrape(t, serve(t, cf.Handler()))
	state := func(host, s string) float64 {
		return value(t, fams, "kernrpc_breaker_state", labels{"method": "Echo.Say", "host": host, "state": s, "side": "client"})
	}
	if state(badHost, "open") != 1 || state(badHost, "closed") != 0 || state(goodHost, "closed") != 1 || state(goodHost, "open") != 0 {
		t.Errorf("breaker states: failing %s open %g closed %g; healthy %s open %g closed %g; want the failing one open only",
			badHost, state(badHost, "open"), state(badHost, "closed"), goodHost, state(goodHost, "open"), state(goodHost, "closed"))
	}
	if got := value(t, fams, "kernrpc_breaker_opened_total", labels{"method": "Echo.Say", "host": badHost}); got != 1 {
		t.Errorf("the failing instance's breaker opened %g times, want 1", got)
	}
	if got := value(t, fams, "kernrpc_client_instances", labels{"service": "stateful", "registry": "memory"}); got != 2 {
		t.Errorf("kernrpc_client_instances = %g, want 2", got)
	}
	if got := value(t, fams, "kernrpc_client_connections_open", labels{"service": "stateful", "transport": "tcp-lv"}); got != 2 {
		t.Errorf("kernrpc_client_connections_open = %g, want 2 (one per instance)", got)
	}
	promtool(t, body)

	var rejected, refusedCalls, limitedCalls, limitedTimed float64
	for _, srv := range []*kernrpc.Server{good, bad} {
		// A call is counted once its answer is written: a refused one
		// just after the bucket counted its rejection, a handled one
		// just after it was timed.
		body, fams := scrapeUntil(t, "http://"+srv.AdminAddr()+"/metrics", func(fams map[string]*dto.MetricFamily) bool {
			return sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Limited", "code": "ResourceExhausted"}) >=
				sumOf(fams, "kernrpc_token_bucket_rejected_total", labels{}) &&
				sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Limited", "code": "OK"}) >=
					sumOf(fams, "kernrpc_server_call_duration_seconds", labels{"method": "Limited"})
		})
		if got := value(t, fams, "kernrpc_server_connections_open", labels{"transport": "tcp-lv"}); got != 1 {
			t.Errorf("%s: kernrpc_server_connections_open = %g, want 1", srv.Addr(), got)
		}
		if got := value(t, fams, "kernrpc_server_serving", labels{"service": "stateful"}); got != 1 {
			t.Errorf("%s: kernrpc_server_serving = %g, want 1", srv.Addr(), got)
		}
		rejected += sumOf(fams, "kernrpc_token_bucket_rejected_total", labels{"bucket": "global", "side": "server"})
		// The calls the bucket refused before Invoke are counted with
		// the code they were answered with, but not timed.
		refusedCalls += sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Limited", "code": "ResourceExhausted"})
		limitedCalls += sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Limited", "code": "OK"})
		limitedTimed += sumOf(fams, "kernrpc_server_call_duration_seconds", labels{"method": "Limited"})
		if got := value(t, fams, "kernrpc_overload_limit", labels{"side": "server"}); got != 20 {
			t.Errorf("%s: kernrpc_overload_limit = %g, want the initial 20", srv.Addr(), got)
		}
		if _, ok := fams["kernrpc_breaker_state"]; ok {
			t.Errorf("%s: the server's page shows the client's breakers", srv.Addr())
		}
		promtool(t, body)
	}
	if rejected != float64(exhausted) {
		t.Errorf("the servers' buckets rejected %g calls, the client saw %d rejected", rejected, exhausted)
	}
	if refusedCalls != float64(exhausted) {
		t.Errorf("the servers counted %g calls of Echo.Limited answered ResourceExhausted, the client saw %d", refusedCalls, exhausted)
	}
	if limitedCalls != float64(10-exhausted) || limitedTimed != limitedCalls {
		t.Errorf("the servers counted %g calls of Echo.Limited answered OK and timed %g, want %d each: refused calls are not timed", limitedCalls, limitedTimed, 10-exhausted)
	}
}

// With registry: default a server and a client in one process share one
// page: the token bucket of each side is a series of its own (side), the
// engine's readings keep their names, and a second client of the same
// service adds to the first one's series instead of failing the scrape.
func TestStateInTheDefaultRegistry(t *testing.T) {
	cfg := parseConfig(t, `
service: shared
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: "prometheus/NS"}}
client: {timeout: 5s}
filters:
  - {name: prometheus, options: {registry: default}}
  - {name: token-bucket, options: {rate: 0.001, burst: 1000}}
`)
	srv := stateServer(t, cfg, false)
	var clis []*kernrpc.Client
	for range 2 {
		cli, err := kernrpc.NewClient(cfg, cfg.Service)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		if err := cli.Call(context.Background(), "Echo.Say", wrapperspb.String("x"), &wrapperspb.StringValue{}); err != nil {
			t.Fatal(err)
		}
		clis = append(clis, cli)
	}
	sf, _ := kernrpc.FindPlugin[*prometheus.Filter](srv.Plugins(), prometheus.Name)
	body, fams := scrape(t, serve(t, sf.Handler()))
	promtool(t, body)
	for side, want := range map[string]float64{"server": 998, "client": 2 * 999} {
		if got := value(t, fams, "kernrpc_token_bucket_tokens", labels{"bucket": "global", "side": side}); got < want || got > want+1 {
			t.Errorf("%s buckets hold %g tokens, want about %g", side, got, want)
		}
	}
	if got := value(t, fams, "kernrpc_client_instances", labels{"service": "shared"}); got != 2 {
		t.Errorf("kernrpc_client_instances = %g, want 2: each client's one instance, added up", got)
	}
	if got := value(t, fams, "kernrpc_server_connections_open", labels{}); got < 2 {
		t.Errorf("kernrpc_server_connections_open = %g, want the 2 clients' connections", got)
	}

	// A closed client's plugins are no longer read.
	_ = clis[1].Close()
	_, fams = scrape(t, serve(t, sf.Handler()))
	if got := value(t, fams, "kernrpc_client_instances", labels{"service": "shared"}); got != 1 {
		t.Errorf("after one client closed, kernrpc_client_instances = %g, want 1", got)
	}
}

// sumOf adds up the series of family name matching want (a histogram's
// counts); 0 if there are none.
func sumOf(fams map[string]*dto.MetricFamily, name string, want labels) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		if want.match(m) {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}
