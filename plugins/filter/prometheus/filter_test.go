package prometheus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/prometheus"
)

func build(t testing.TB, opts map[string]any) *prometheus.Filter {
	t.Helper()
	f, err := prometheus.Factory.Build(opts, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.(*prometheus.Filter).Close() })
	return f.(*prometheus.Filter)
}

// answer is a next that answers with err after sizing the call as the
// engine does.
func answer(reqSize, respSize int, err error) kernel.Invoker {
	return func(_ context.Context, info *kernel.CallInfo, _ any) (any, error) {
		info.Attempt = 1
		info.RequestSize = reqSize
		if err != nil {
			return nil, err
		}
		info.ResponseSize = respSize
		return "ok", nil
	}
}

// served runs one server call through f as the engine does: Invoke, then
// CallEnded with what the call was answered with.
func served(f *prometheus.Filter, method string, next kernel.Invoker) {
	info := &kernel.CallInfo{Method: method, Side: kernel.ServerSide}
	_, err := f.Invoke(context.Background(), info, nil, next)
	f.CallEnded(info, err, true)
}

func TestCountsByMethodAndCode(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	ctx := context.Background()
	for i := 0; i < 7; i++ {
		_, _ = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ClientSide}, nil, answer(10, 30, nil))
	}
	for i := 0; i < 3; i++ {
		_, _ = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ClientSide}, nil, answer(10, 0, kernel.Errorf(kernel.NotFound, "no")))
	}
	_, _ = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ClientSide}, nil, answer(0, 0, context.DeadlineExceeded))
	_, _ = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ClientSide}, nil, answer(0, 0, fmt.Errorf("wrapped: %w", kernel.Errorf(kernel.Aborted, "x"))))
	_, _ = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ClientSide}, nil, answer(0, 0, &kernel.Status{Code: 99}))
	for i := 0; i < 4; i++ {
		served(f, "/pkg.Greeter/Hello", answer(5, 0, nil))
	}

	_, fams := scrape(t, serve(t, f.Handler()))
	say := labels{"service": "Echo", "method": "Say"}
	for code, want := range map[string]float64{"OK": 7, "NotFound": 3, "DeadlineExceeded": 1, "Aborted": 1, "Unknown": 1} {
		if got := value(t, fams, "kernrpc_client_calls_total", labels{"service": "Echo", "method": "Say", "code": code}); got != want {
			t.Errorf("client calls with code %s: %g, want %g", code, got, want)
		}
	}
	if n := len(fams["kernrpc_client_calls_total"].GetMetric()); n != 5 {
		t.Errorf("%d client call series, want one per code seen (5)", n)
	}
	checkHistogram(t, fams, "kernrpc_client_call_duration_seconds", say, 13)
	for name, want := range map[string]float64{
		"kernrpc_client_request_bytes_total":  10 * 10,
		"kernrpc_client_response_bytes_total": 7 * 30,
		"kernrpc_client_attempts_total":       13,
		"kernrpc_client_calls_in_flight":      0,
	} {
		if got := value(t, fams, name, say); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	hello := labels{"service": "pkg.Greeter", "method": "Hello"}
	if got := value(t, fams, "kernrpc_server_calls_total", labels{"service": "pkg.Greeter", "method": "Hello", "code": "OK"}); got != 4 {
		t.Errorf("server calls %g, want 4", got)
	}
	checkHistogram(t, fams, "kernrpc_server_call_duration_seconds", hello, 4)
	if got := value(t, fams, "kernrpc_server_request_bytes_total", hello); got != 20 {
		t.Errorf("server request bytes %g, want 20", got)
	}
	if got := value(t, fams, "kernrpc_server_response_bytes_total", hello); got != 0 {
		t.Errorf("server response bytes %g, want 0: the server encodes the answer after the filters return, and CallEnded said 0", got)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams[name]; ok {
			t.Errorf("%s scraped with go_metrics and process_metrics off", name)
		}
	}
}

// The server's CallEnded adds every answer's size, and counts the calls
// answered before Invoke (handled false) by code, with their request's
// size but without a duration; a handled call is not counted twice.
func TestCallEnded(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		info := &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ServerSide}
		_, err := f.Invoke(ctx, info, nil, answer(10, 0, nil))
		info.ResponseSize = 7 // the server encodes the answer after Invoke
		f.CallEnded(info, err, true)
	}
	for i := 0; i < 2; i++ {
		info := &kernel.CallInfo{Method: "Echo.Fail", Side: kernel.ServerSide}
		_, err := f.Invoke(ctx, info, nil, answer(10, 0, kernel.Errorf(kernel.NotFound, "no")))
		f.CallEnded(info, err, true) // an error answer has no payload
	}
	refusals := []error{
		kernel.Errorf(kernel.ResourceExhausted, "no token"),
		kernel.Errorf(kernel.ResourceExhausted, "no token"),
		kernel.Errorf(kernel.Unauthenticated, "no credentials"),
		fmt.Errorf("wrapped: %w", kernel.Errorf(kernel.InvalidArgument, "decode")),
	}
	for _, err := range refusals {
		f.CallEnded(&kernel.CallInfo{Method: "Echo.Say", Side: kernel.ServerSide, RequestSize: 3}, err, false)
	}
	// A method only ever refused still gets its series, with no duration.
	f.CallEnded(&kernel.CallInfo{Method: "Echo.Locked", RequestSize: 4, ResponseSize: 0}, kernel.Errorf(kernel.PermissionDenied, "no"), false)

	body, fams := scrape(t, serve(t, f.Handler()))
	say := labels{"service": "Echo", "method": "Say"}
	for _, c := range []struct {
		method, code string
		want         float64
	}{
		{"Say", "OK", 5}, {"Say", "ResourceExhausted", 2}, {"Say", "Unauthenticated", 1}, {"Say", "InvalidArgument", 1},
		{"Fail", "NotFound", 2}, {"Locked", "PermissionDenied", 1},
	} {
		if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": c.method, "code": c.code}); got != c.want {
			t.Errorf("server calls of %s with %s: %g, want %g", c.method, c.code, got, c.want)
		}
	}
	if n := len(fams["kernrpc_server_calls_total"].GetMetric()); n != 6 {
		t.Errorf("%d server call series, want 6", n)
	}
	checkHistogram(t, fams, "kernrpc_server_call_duration_seconds", say, 5)
	checkHistogram(t, fams, "kernrpc_server_call_duration_seconds", labels{"method": "Locked"}, 0)
	for _, c := range []struct {
		name   string
		method string
		want   float64
	}{
		{"kernrpc_server_response_bytes_total", "Say", 5 * 7},
		{"kernrpc_server_response_bytes_total", "Fail", 0},
		{"kernrpc_server_request_bytes_total", "Say", 5*10 + 4*3},
		{"kernrpc_server_request_bytes_total", "Locked", 4},
		{"kernrpc_server_calls_in_flight", "Say", 0},
		{"kernrpc_server_calls_in_flight", "Locked", 0},
	} {
		if got := value(t, fams, c.name, labels{"method": c.method}); got != c.want {
			t.Errorf("%s of %s = %g, want %g", c.name, c.method, got, c.want)
		}
	}
	if _, ok := fams["kernrpc_client_calls_total"]; ok {
		t.Error("CallEnded counted a client call")
	}
	promtool(t, body)
}

// A handler's answer that fails to encode goes out as Internal: the
// server counts the call by that code, not by the handler's nil.
func TestServerCountsTheCodeAnswered(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	info := &kernel.CallInfo{Method: "Echo.Say", Side: kernel.ServerSide}
	if _, err := f.Invoke(context.Background(), info, nil, answer(3, 0, nil)); err != nil {
		t.Fatal(err)
	}
	f.CallEnded(info, kernel.Errorf(kernel.Internal, "the answer failed to encode"), true)
	_, fams := scrape(t, serve(t, f.Handler()))
	for code, want := range map[string]float64{"OK": 0, "Internal": 1} {
		if got := sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Say", "code": code}); got != want {
			t.Errorf("calls counted %s: %g, want %g", code, got, want)
		}
	}
	checkHistogram(t, fams, "kernrpc_server_call_duration_seconds", labels{"method": "Say"}, 1)
}

// A next that panics ends the call as Internal: it is not in flight for
// ever. The client's filter counts the code itself; the server's is told
// it by CallEnded, once the server turned the panic into Internal.
func TestPanicEndsTheCall(t *testing.T) {
	for _, side := range []kernel.Side{kernel.ClientSide, kernel.ServerSide} {
		f := build(t, nil)
		info := &kernel.CallInfo{Method: "Echo.Boom", Side: side}
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the panic did not go through the filter")
				}
			}()
			_, _ = f.Invoke(context.Background(), info, nil,
				func(context.Context, *kernel.CallInfo, any) (any, error) { panic("boom") })
		}()
		if side == kernel.ServerSide {
			f.CallEnded(info, kernel.Errorf(kernel.Internal, "handler panicked"), true)
		}
		_, fams := scrape(t, serve(t, f.Handler()))
		p := map[kernel.Side]string{kernel.ClientSide: "kernrpc_client_", kernel.ServerSide: "kernrpc_server_"}[side]
		boom := labels{"service": "Echo", "method": "Boom"}
		if got := value(t, fams, p+"calls_in_flight", boom); got != 0 {
			t.Errorf("%s: in flight after a panic: %g, want 0", p, got)
		}
		if got := value(t, fams, p+"calls_total", labels{"method": "Boom", "code": "Internal"}); got != 1 {
			t.Errorf("%s: calls ended by a panic counted as Internal: %g, want 1", p, got)
		}
		checkHistogram(t, fams, p+"call_duration_seconds", boom, 1)
	}
}

func TestInFlightWhileNextRuns(t *testing.T) {
	f := build(t, nil)
	url := serve(t, f.Handler())
	entered, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			served(f, "Echo.Slow",
				func(context.Context, *kernel.CallInfo, any) (any, error) {
					entered <- struct{}{}
					<-release
					return "ok", nil
				})
		}()
	}
	for i := 0; i < 3; i++ {
		<-entered
	}
	slow := labels{"service": "Echo", "method": "Slow"}
	_, fams := scrape(t, url)
	if got := value(t, fams, "kernrpc_server_calls_in_flight", slow); got != 3 {
		t.Errorf("in flight while 3 calls wait: %g", got)
	}
	close(release)
	wg.Wait()
	_, fams = scrape(t, url)
	if got := value(t, fams, "kernrpc_server_calls_in_flight", slow); got != 0 {
		t.Errorf("in flight once they returned: %g", got)
	}
	if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": "Slow", "code": "OK"}); got != 3 {
		t.Errorf("calls %g, want 3", got)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "promhttp_metric_handler_requests_total"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s by default", name)
		}
	}
}

// Callers naming ever new methods must not grow the series without end.
func TestMaxMethods(t *testing.T) {
	f := build(t, map[string]any{"max_methods": 2})
	for i := 0; i < 5; i++ {
		for j := 0; j < 2; j++ {
			served(f, fmt.Sprintf("Svc.M%d", i), answer(1, 0, nil))
		}
	}
	_, fams := scrape(t, serve(t, f.Handler()))
	if got := len(fams["kernrpc_server_calls_total"].GetMetric()); got != 3 {
		t.Errorf("%d series, want 3: two methods and _other", got)
	}
	for m, want := range map[string]float64{"M0": 2, "M1": 2, "_other": 6} {
		if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": m}); got != want {
			t.Errorf("method %s: %g calls, want %g", m, got, want)
		}
	}
}

func TestLabelsOfMethodNames(t *testing.T) {
	f := build(t, nil)
	for _, tc := range []struct{ full, service, method string }{
		{"Echo.Say", "Echo", "Say"},
		{"pkg.v1.Echo.Say", "pkg.v1.Echo", "Say"},
		{"/pkg.Echo/Say", "pkg.Echo", "Say"},
		{"/nosecond", "", "nosecond"},
		{"plain", "", "plain"},
		{"Bad.\xff\xfe", "Bad", "\uFFFD"},
	} {
		_, _ = f.Invoke(context.Background(), &kernel.CallInfo{Method: tc.full, Side: kernel.ClientSide}, nil, answer(1, 1, nil))
		_, fams := scrape(t, serve(t, f.Handler()))
		if got := value(t, fams, "kernrpc_client_calls_total", labels{"service": tc.service, "method": tc.method, "code": "OK"}); got != 1 {
			t.Errorf("%q: %g calls under service=%q method=%q, want 1", tc.full, got, tc.service, tc.method)
		}
	}
}

func TestOwnListener(t *testing.T) {
	f := build(t, map[string]any{"address": "127.0.0.1:0"})
	served(f, "Echo.Say", answer(1, 0, nil))
	if f.Addr() == "" {
		t.Fatal("no address with the address option set")
	}
	_, fams := scrape(t, "http://"+f.Addr()+"/metrics")
	if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": "Say"}); got != 1 {
		t.Errorf("%g calls on the own listener, want 1", got)
	}
	addr := f.Addr()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("%s still accepts after Close", addr)
	}
	if routes := f.AdminRoutes(); len(routes) != 1 || routes[0].Pattern != "GET /metrics" || routes[0].Handler == nil || routes[0].Doc == "" {
		t.Errorf("admin routes %+v, want one GET /metrics with a handler and a doc", routes)
	}
	if build(t, nil).Addr() != "" {
		t.Error("a listener of its own without the address option")
	}
}

// With native_histograms, a scraper that negotiates the protobuf format
// gets a sparse histogram beside the classic buckets.
func TestNativeHistograms(t *testing.T) {
	for _, native := range []bool{false, true} {
		f := build(t, map[string]any{"native_histograms": native})
		for i := 0; i < 5; i++ {
			served(f, "Echo.Say", answer(1, 0, nil))
		}
		body := get(t, serve(t, f.Handler()), string(expfmt.NewFormat(expfmt.TypeProtoDelim)))
		dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.NewFormat(expfmt.TypeProtoDelim))
		found := false
		for {
			mf := &dto.MetricFamily{}
			if err := dec.Decode(mf); err != nil {
				break
			}
			if mf.GetName() != "kernrpc_server_call_duration_seconds" {
				continue
			}
			found = true
			h := mf.GetMetric()[0].GetHistogram()
			sparse := len(h.GetPositiveSpan()) > 0 || h.GetZeroCount() > 0
			if sparse != native {
				t.Errorf("native_histograms %v: sparse buckets %v (schema %d, spans %v)", native, sparse, h.GetSchema(), h.GetPositiveSpan())
			}
			if len(h.GetBucket()) == 0 || h.GetSampleCount() != 5 {
				t.Errorf("native_histograms %v: %d classic buckets and count %d, want buckets and 5", native, len(h.GetBucket()), h.GetSampleCount())
			}
		}
		if !found {
			t.Errorf("native_histograms %v: no duration family in the protobuf scrape", native)
		}
	}
}

func TestBadOptions(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name    string
		opts    map[string]any
		key     string
		message string
	}{
		{"no buckets", map[string]any{"buckets": []any{}}, "buckets", "at least one"},
		{"a bucket not positive", map[string]any{"buckets": []any{"0s", "1s"}}, "buckets", "positive"},
		{"buckets not increasing", map[string]any{"buckets": []any{"1ms", "1ms"}}, "buckets", "increase"},
		{"a bucket not a duration", map[string]any{"buckets": []any{"fast"}}, "buckets[0]", "duration"},
		{"max_methods zero", map[string]any{"max_methods": 0}, "max_methods", "at least 1"},
		{"an unknown registry", map[string]any{"registry": "global"}, "registry", `"global"`},
		{"an address in use", map[string]any{"address": taken.Addr().String()}, "address", "in use"},
		{"an address that is none", map[string]any{"address": "nowhere"}, "address", "missing port"},
		{"an unknown option", map[string]any{"adress": ":9464"}, "adress", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := prometheus.Factory.Build(tc.opts, "svc.yaml")
			if err == nil {
				f.(*prometheus.Filter).Close()
				t.Fatalf("built with %v", tc.opts)
			}
			var pe *kernel.PluginError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), `"`+tc.key+`"`) || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q (%T), want a PluginError naming option %q and saying %q", err, err, tc.key, tc.message)
			}
		})
	}
}

// Method names that differ but give one service and method label (the
// two spellings of a gRPC-style name, names whose invalid bytes both read
// as U+FFFD, a method named as the overflow series) must add up in one
// series: two series with the same labels fail the whole scrape.
func TestMethodNamesWithTheSameLabels(t *testing.T) {
	f := build(t, map[string]any{"max_methods": 4, "go_metrics": false, "process_metrics": false})
	for _, name := range []string{"pkg.Echo.Say", "/pkg.Echo/Say", "Bad.\xff", "Bad.\xfe", "_other._other", "M.A", "M.B"} {
		_, _ = f.Invoke(context.Background(), &kernel.CallInfo{Method: name, Side: kernel.ClientSide}, nil, answer(1, 1, nil))
	}
	_, fams := scrape(t, serve(t, f.Handler()))
	for _, tc := range []struct {
		service, method string
		want            float64
	}{{"pkg.Echo", "Say", 2}, {"Bad", "\uFFFD", 2}, {"_other", "_other", 3}} {
		if got := value(t, fams, "kernrpc_client_calls_total", labels{"service": tc.service, "method": tc.method, "code": "OK"}); got != tc.want {
			t.Errorf("service=%q method=%q: %g calls, want %g", tc.service, tc.method, got, tc.want)
		}
	}
}

// An error that is a nil *kernel.Status (a typed nil: a handler's "var st
// *kernel.Status; return nil, st") is counted as the caller gets it,
// Unknown, on either side and for a stream too; the filter neither
// panics on it nor turns it into Internal.
func TestNilStatusErrorCountsAsUnknown(t *testing.T) {
	var nilStatus *kernel.Status
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	noPanic := func(what string, run func() error) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%s: the filter panicked on a nil *kernel.Status error: %v", what, p)
			}
		}()
		if err := run(); err != error(nilStatus) {
			t.Errorf("%s: returned %v, want next's nil *kernel.Status as it was", what, err)
		}
	}
	noPanic("client call", func() error {
		_, err := f.Invoke(context.Background(), &kernel.CallInfo{Method: "Echo.Nil", Side: kernel.ClientSide}, nil, answer(1, 0, nilStatus))
		return err
	})
	noPanic("server call", func() error {
		info := &kernel.CallInfo{Method: "Echo.Nil", Side: kernel.ServerSide}
		_, err := f.Invoke(context.Background(), info, nil, answer(1, 0, nilStatus))
		f.CallEnded(info, err, true)
		return err
	})
	noPanic("server stream", func() error {
		return streamOf(f, "Echo.NilStream", kernel.ServerSide, &memStream{limit: -1}, talk(0, nilStatus))
	})
	_, fams := scrape(t, serve(t, f.Handler()))
	for _, name := range []string{"kernrpc_client_calls_total", "kernrpc_server_calls_total"} {
		if got := value(t, fams, name, labels{"method": "Nil", "code": "Unknown"}); got != 1 {
			t.Errorf("%s{code=Unknown}: %g, want 1", name, got)
		}
	}
	if got := value(t, fams, "kernrpc_server_streams_ended_total", labels{"method": "NilStream", "code": "Unknown"}); got != 1 {
		t.Errorf("kernrpc_server_streams_ended_total{code=Unknown}: %g, want 1", got)
	}
}
