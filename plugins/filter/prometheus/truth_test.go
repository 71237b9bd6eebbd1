package prometheus_test

import (
	"context"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// An answer the transport refuses for its size (over max_frame_size) is
// replaced by a ResourceExhausted status, which is what the caller gets:
// the server's calls_total must count the call with that code, and its
// response bytes must not count the answer that was never sent.
func TestServerCountsAnAnswerTheTransportRefusedAsItsReplacement(t *testing.T) {
	yaml := echoYAML + "transport: {name: tcp-lv, options: {max_frame_size: 64KiB}}\n"
	_, cli, sf, cf := echoService(t, yaml, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Grow", func(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String(strings.Repeat("x", 100<<10)), nil
		})
	})
	err := cli.Call(context.Background(), "Echo.Grow", wrapperspb.String("x"), &wrapperspb.StringValue{})
	if kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("Echo.Grow: %v, want ResourceExhausted", err)
	}
	grow := labels{"service": "Echo", "method": "Grow"}
	_, cfams := scrape(t, serve(t, cf.Handler()))
	if got := value(t, cfams, "kernrpc_client_calls_total", labels{"method": "Grow", "code": "ResourceExhausted"}); got != 1 {
		t.Errorf("client: %g calls of Echo.Grow ended ResourceExhausted, want 1", got)
	}
	_, fams := scrapeAnswered(t, serve(t, sf.Handler()), 1)
	for _, m := range fams["kernrpc_server_calls_total"].GetMetric() {
		if grow.match(m) {
			t.Logf("server: kernrpc_server_calls_total%v = %g", labelMap(m), m.GetCounter().GetValue())
		}
	}
	if got := sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Grow", "code": "ResourceExhausted"}); got != 1 {
		t.Errorf("server: %g calls of Echo.Grow counted ResourceExhausted, the code the caller got; want 1", got)
	}
	if got := sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Grow", "code": "OK"}); got != 0 {
		t.Errorf("server: %g calls of Echo.Grow counted OK, though their answer was never sent; want 0", got)
	}
	if got := value(t, fams, "kernrpc_server_response_bytes_total", grow); got != 0 {
		t.Errorf("server: kernrpc_server_response_bytes_total of Echo.Grow = %g, want 0: the answer was refused, a status went instead", got)
	}
}

// A stream handler's error that claims OK (a *kernel.Status with code OK)
// reaches the caller as Unknown, since an error is no answer, as a unary
// call's does: the server's streams_ended_total must count it Unknown,
// as the client's does, not OK.
func TestServerStreamEndedWithAnErrorClaimingOKCountsUnknown(t *testing.T) {
	_, cli, sf, cf := echoService(t, echoYAML, func(srv *kernrpc.Server) {
		kernrpc.HandleBidiStream(srv, "Echo.Odd", func(ctx context.Context, st chatStream) error {
			return &kernel.Status{Code: kernel.OK, Message: "an error that says OK"}
		})
	})
	st, err := kernrpc.OpenStream[wrapperspb.StringValue, wrapperspb.StringValue](t.Context(), cli, "Echo.Odd")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); kernel.CodeOf(err) != kernel.Unknown {
		t.Fatalf("the stream ended with %v, want Unknown", err)
	}
	odd := labels{"service": "Echo", "method": "Odd"}
	for _, side := range []struct {
		name string
		url  string
	}{{"client", serve(t, cf.Handler())}, {"server", serve(t, sf.Handler())}} {
		p := "kernrpc_" + side.name + "_"
		_, fams := scrapeUntil(t, side.url, func(fams map[string]*dto.MetricFamily) bool {
			return sumOf(fams, p+"streams_ended_total", odd) >= 1
		})
		for _, m := range fams[p+"streams_ended_total"].GetMetric() {
			if odd.match(m) {
				t.Logf("%sstreams_ended_total%v = %g", p, labelMap(m), m.GetCounter().GetValue())
			}
		}
		if got := sumOf(fams, p+"streams_ended_total", labels{"method": "Odd", "code": "Unknown"}); got != 1 {
			t.Errorf("%s: %g streams of Echo.Odd counted ended Unknown, the code the caller got; want 1", side.name, got)
		}
	}
}
