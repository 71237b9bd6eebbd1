package oteltracing_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
)

// chain is three parties: a client calling A.Call, whose handler calls
// B.Call with a client of its own, passing its context on. Each party's
// config has the filters the test gives, as a config file would.
type chain struct {
	client *kernrpc.Client
	a, b   *kernrpc.Server
	// seen is what B's handler found in its context, for each call.
	mu   sync.Mutex
	seen []seen
}

type seen struct {
	sc     trace.SpanContext
	tenant string // the baggage member "tenant"
	md     kernel.Metadata
}

// config is a service's config with the given filters block, in YAML.
func config(t *testing.T, service, filters string) *kernrpc.Config {
	t.Helper()
	yaml := fmt.Sprintf("service: %s\naddress: 127.0.0.1:0\nregistry: {name: memory, options: {namespace: %q}}\nclient: {timeout: 5s}\nfilters:\n%s",
		service, "oteltracing/"+t.Name(), filters)
	cfg, err := kernrpc.ParseConfig([]byte(yaml), service+".yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The filters of a party that traces calls, attempts and what it serves.
const traced = `
  - {name: otel-tracing}
  - {name: otel-tracing, side: client, options: {span: attempt}}
`

func startChain(t *testing.T, filtersClient, filtersA, filtersB string) *chain {
	t.Helper()
	c := &chain{}
	c.b = serve(t, config(t, "b", filtersB), "B.Call", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		c.mu.Lock()
		c.seen = append(c.seen, seen{
			sc:     trace.SpanContextFromContext(ctx),
			tenant: baggage.FromContext(ctx).Member("tenant").Value(),
			md:     kernrpc.IncomingMetadata(ctx).Clone(),
		})
		c.mu.Unlock()
		switch req.Value {
		case "fail":
			return nil, kernel.Errorf(kernel.Internal, "b broke")
		case "refuse":
			return nil, kernel.Errorf(kernel.FailedPrecondition, "not now")
		}
		return wrapperspb.String("b:" + req.Value), nil
	})
	cfgA := config(t, "a", filtersA)
	toB, err := kernrpc.NewClient(cfgA, "b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = toB.Close() })
	c.a = serve(t, cfgA, "A.Call", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		var resp wrapperspb.StringValue
		if err := toB.Call(ctx, "B.Call", req, &resp); err != nil {
			return nil, err
		}
		return wrapperspb.String("a:" + resp.Value), nil
	})
	if c.client, err = kernrpc.NewClient(config(t, "a", filtersClient), "a"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.Close() })
	return c
}

func serve(t *testing.T, cfg *kernrpc.Config, method string, h func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) *kernrpc.Server {
	t.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, method, h)
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

func (c *chain) call(ctx context.Context, text string) (string, error) {
	var resp wrapperspb.StringValue
	err := c.client.Call(ctx, "A.Call", wrapperspb.String(text), &resp)
	return resp.Value, err
}

func (c *chain) lastSeen(t *testing.T) seen {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) == 0 {
		t.Fatal("B's handler was not called")
	}
	return c.seen[len(c.seen)-1]
}

// attrs is a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// want is what the test expects of one span of the chain.
type want struct {
	name   string
	kind   trace.SpanKind
	parent int // index in the chain's order, -1: the caller's
	attrs  map[string]any
}

func checkSpan(t *testing.T, i int, got tracetest.SpanStub, ro sdktrace.ReadOnlySpan, w want) {
	t.Helper()
	if got.Name != w.name || got.SpanKind != w.kind {
		t.Errorf("span %d is %q (%s), want %q (%s)", i, got.Name, got.SpanKind, w.name, w.kind)
	}
	a := attrs(ro)
	for k, v := range w.attrs {
		g, ok := a[attribute.Key(k)]
		if !ok {
			t.Errorf("span %d %q has no %s (has %v)", i, got.Name, k, a)
			continue
		}
		if g.AsInterface() != v {
			t.Errorf("span %d %q: %s = %v (%T), want %v (%T)", i, got.Name, k, g.AsInterface(), g.AsInterface(), v, v)
		}
	}
}

// ordered returns the chain's six spans in the order they nest, each the
// parent of the next, starting with the one whose parent is root; it
// fails t if they do not form that line.
func ordered(t *testing.T, stubs tracetest.SpanStubs, root trace.SpanID) []int {
	t.Helper()
	byParent := make(map[trace.SpanID][]int)
	for i, s := range stubs {
		byParent[s.Parent.SpanID()] = append(byParent[s.Parent.SpanID()], i)
	}
	var line []int
	for parent := root; ; {
		kids := byParent[parent]
		if len(kids) == 0 {
			break
		}
		if len(kids) > 1 {
			t.Fatalf("span %s has %d children, want 1: %v", parent, len(kids), names(stubs))
		}
		line = append(line, kids[0])
		parent = stubs[kids[0]].SpanContext.SpanID()
	}
	if len(line) != len(stubs) {
		t.Fatalf("%d of the %d spans nest in one line from the root: %v", len(line), len(stubs), names(stubs))
	}
	return line
}

func names(stubs tracetest.SpanStubs) []string {
	var n []string
	for _, s := range stubs {
		n = append(n, fmt.Sprintf("%s(%s, parent %s)", s.Name, s.SpanContext.SpanID(), s.Parent.SpanID()))
	}
	return n
}

func port(addr string) int64 {
	var p int64
	fmt.Sscanf(addr[strings.LastIndexByte(addr, ':')+1:], "%d", &p)
	return p
}

// waitSpans returns the spans recorded once there are n, or after 5 s:
// a server span ends once its answer is sent, which can be after the
// client has it.
func waitSpans(t *testing.T, n int) tracetest.SpanStubs {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stubs := spans.GetSpans()
		if len(stubs) >= n || time.Now().After(deadline) {
			return stubs
		}
		time.Sleep(time.Millisecond)
	}
}

func TestChainMakesOneTraceOfSixSpans(t *testing.T) {
	spans.Reset()
	c := startChain(t, traced, traced, traced)
	got, err := c.call(context.Background(), "hi")
	if err != nil || got != "a:b:hi" {
		t.Fatalf("call: %q, %v", got, err)
	}
	stubs := waitSpans(t, 6)
	if len(stubs) != 6 {
		t.Fatalf("%d spans, want 6: %v", len(stubs), names(stubs))
	}
	ro := stubs.Snapshots()
	tid := stubs[0].SpanContext.TraceID()
	for i, s := range stubs {
		if s.SpanContext.TraceID() != tid {
			t.Errorf("span %d %q is in trace %s, want %s: not one trace", i, s.Name, s.SpanContext.TraceID(), tid)
		}
		if !s.SpanContext.IsSampled() {
			t.Errorf("span %d %q is not sampled", i, s.Name)
		}
	}
	line := ordered(t, stubs, trace.SpanID{})
	req := int64(len(`hi`) + 2) // a StringValue: tag, length, text
	wants := []want{
		{"A.Call", trace.SpanKindClient, -1, map[string]any{
			"rpc.system.name": "kernrpc", "rpc.method": "A.Call", "rpc.response.status_code": "OK",
			"server.address": "127.0.0.1", "server.port": port(c.a.Addr()), "rpc.kernrpc.attempt": int64(1),
			"rpc.kernrpc.request.size": req, "rpc.kernrpc.response.size": req + 4,
		}},
		{"A.Call attempt", trace.SpanKindClient, 0, map[string]any{
			"rpc.system.name": "kernrpc", "rpc.method": "A.Call", "rpc.response.status_code": "OK",
			"server.address": "127.0.0.1", "server.port": port(c.a.Addr()), "rpc.kernrpc.attempt": int64(1),
			"rpc.kernrpc.request.size": req, "rpc.kernrpc.response.size": req + 4,
		}},
		{"A.Call", trace.SpanKindServer, 1, map[string]any{
			"rpc.system.name": "kernrpc", "rpc.method": "A.Call", "rpc.response.status_code": "OK",
			"network.peer.address": "127.0.0.1", "rpc.kernrpc.request.size": req, "rpc.kernrpc.response.size": req + 4,
		}},
		{"B.Call", trace.SpanKindClient, 2, map[string]any{
			"rpc.method": "B.Call", "rpc.response.status_code": "OK",
			"server.address": "127.0.0.1", "server.port": port(c.b.Addr()), "rpc.kernrpc.attempt": int64(1),
			"rpc.kernrpc.request.size": req, "rpc.kernrpc.response.size": req + 2,
		}},
		{"B.Call attempt", trace.SpanKindClient, 3, map[string]any{
			"rpc.method": "B.Call", "server.port": port(c.b.Addr()), "rpc.kernrpc.attempt": int64(1),
		}},
		{"B.Call", trace.SpanKindServer, 4, map[string]any{
			"rpc.system.name": "kernrpc", "rpc.method": "B.Call", "rpc.response.status_code": "OK",
			"network.peer.address": "127.0.0.1", "rpc.kernrpc.response.size": req + 2,
		}},
	}
	for i, w := range wants {
		checkSpan(t, i, stubs[line[i]], ro[line[i]], w)
		if s := stubs[line[i]]; s.Status.Code != codes.Unset {
			t.Errorf("span %d %q has status %v, want unset", i, s.Name, s.Status)
		}
	}
	// The server spans' parents are remote (they came over the wire), the
	// others' local.
	for i, remote := range []bool{false, false, true, false, false, true} {
		if p := stubs[line[i]].Parent; i > 0 && p.IsRemote() != remote {
			t.Errorf("span %d %q: parent remote = %v, want %v", i, stubs[line[i]].Name, p.IsRemote(), remote)
		}
	}
	// B's handler runs in its server span.
	if sc := c.lastSeen(t).sc; sc.SpanID() != stubs[line[5]].SpanContext.SpanID() {
		t.Errorf("B's handler sees span %s, want its server span %s", sc.SpanID(), stubs[line[5]].SpanContext.SpanID())
	}
	// What went over the wire to B is its attempt span's traceparent.
	if tp, want := c.lastSeen(t).md["traceparent"], "00-"+tid.String()+"-"+stubs[line[4]].SpanContext.SpanID().String()+"-01"; tp != want {
		t.Errorf("B received traceparent %q, want the attempt span's %q", tp, want)
	}
}

func TestFailedCallRecordsTheErrorAndCode(t *testing.T) {
	c := startChain(t, traced, traced, traced)
	for _, tc := range []struct {
		text, code   string
		serverStatus codes.Code // B's server span: an Internal is its fault, a FailedPrecondition not
	}{
		{"fail", "Internal", codes.Error},
		{"refuse", "FailedPrecondition", codes.Unset},
	} {
		spans.Reset()
		if _, err := c.call(context.Background(), tc.text); kernel.CodeOf(err).String() != tc.code {
			t.Fatalf("%s: got %v, want code %s", tc.text, err, tc.code)
		}
		stubs := waitSpans(t, 6)
		if len(stubs) != 6 {
			t.Fatalf("%s: %d spans, want 6: %v", tc.text, len(stubs), names(stubs))
		}
		ro := stubs.Snapshots()
		for _, i := range ordered(t, stubs, trace.SpanID{}) {
			s := stubs[i]
			wantStatus := codes.Error
			if s.SpanKind == trace.SpanKindServer {
				wantStatus = tc.serverStatus
			}
			if s.Status.Code != wantStatus {
				t.Errorf("%s: span %q (%s) has status %v, want %v", tc.text, s.Name, s.SpanKind, s.Status, wantStatus)
			}
			a := attrs(ro[i])
			if got := a["rpc.response.status_code"].AsString(); got != tc.code {
				t.Errorf("%s: span %q (%s): rpc.response.status_code %q, want %q", tc.text, s.Name, s.SpanKind, got, tc.code)
			}
			if wantStatus != codes.Error {
				continue
			}
			if got := a["error.type"].AsString(); got != tc.code {
				t.Errorf("%s: span %q: error.type %q, want %q", tc.text, s.Name, got, tc.code)
			}
			if !strings.Contains(s.Status.Description, "b broke") && !strings.Contains(s.Status.Description, "not now") {
				t.Errorf("%s: span %q: status description %q does not carry the error's message", tc.text, s.Name, s.Status.Description)
			}
			if len(s.Events) != 1 || s.Events[0].Name != "exception" {
				t.Errorf("%s: span %q: events %v, want the recorded error", tc.text, s.Name, s.Events)
			}
		}
	}
}

func TestBaggageCrosses(t *testing.T) {
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	for _, tc := range []struct{ name, filters string }{
		{"recorded", traced},
		{"not recorded", "  - {name: otel-tracing, options: {sampler: never}}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans.Reset()
			c := startChain(t, tc.filters, tc.filters, tc.filters)
			if _, err := c.call(ctx, "hi"); err != nil {
				t.Fatal(err)
			}
			if got := c.lastSeen(t).tenant; got != "acme" {
				t.Errorf("B's handler has baggage tenant=%q, want acme (metadata %v)", got, c.lastSeen(t).md)
			}
		})
	}
}

// parentCtx is a context whose current span is the caller's own: a span
// context with the sampled flag given, as an application's span would be.
func parentCtx(sampled bool) (context.Context, trace.SpanContext) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid}
	if sampled {
		cfg.TraceFlags = trace.FlagsSampled
	}
	sc := trace.NewSpanContext(cfg)
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

func TestSamplingOff(t *testing.T) {
	never := "  - {name: otel-tracing, options: {sampler: never}}\n  - {name: otel-tracing, side: client, options: {span: attempt}}\n"
	for _, tc := range []struct {
		name              string
		filters           string
		sampled           bool
		wantParentPassing bool // B sees the caller's span context as it was
	}{
		// never passes the caller's context through, sampled or not.
		{"never, sampled parent", never, true, true},
		{"never, unsampled parent", never, false, true},
		// parent-ratio follows the unsampled flag, and records nothing.
		{"parent-ratio, unsampled parent", traced, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans.Reset()
			c := startChain(t, tc.filters, tc.filters, tc.filters)
			ctx, parent := parentCtx(tc.sampled)
			if _, err := c.call(ctx, "hi"); err != nil {
				t.Fatal(err)
			}
			if n := len(spans.GetSpans()); n != 0 {
				t.Errorf("%d spans recorded, want none: %v", n, names(spans.GetSpans()))
			}
			s := c.lastSeen(t)
			if !s.sc.Equal(parent.WithRemote(true)) {
				t.Errorf("B's handler has span context %+v, want the caller's %+v", s.sc, parent)
			}
			flags := "00"
			if tc.sampled {
				flags = "01"
			}
			if tp, want := s.md["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"+flags; tp != want {
				t.Errorf("B received traceparent %q, want the caller's %q", tp, want)
			}
		})
	}
	// A trace the first client declines to start (ratio 0) is left out
	// downstream too, though A and B would record every trace they start.
	t.Run("parent-ratio 0 at the root", func(t *testing.T) {
		spans.Reset()
		c := startChain(t, "  - {name: otel-tracing, options: {ratio: 0}}\n", traced, traced)
		if _, err := c.call(context.Background(), "hi"); err != nil {
			t.Fatal(err)
		}
		if n := len(spans.GetSpans()); n != 0 {
			t.Errorf("%d spans recorded, want none: %v", n, names(spans.GetSpans()))
		}
		s := c.lastSeen(t)
		if !s.sc.IsValid() || s.sc.IsSampled() {
			t.Errorf("B's handler has span context %+v, want a valid unsampled one", s.sc)
		}
		if tp := s.md["traceparent"]; !strings.HasSuffix(tp, "-00") || !strings.Contains(tp, s.sc.TraceID().String()) {
			t.Errorf("B received traceparent %q, want an unsampled one of trace %s", tp, s.sc.TraceID())
		}
	})
	// never at the root sends nothing: B starts a trace of its own.
	t.Run("never at the root", func(t *testing.T) {
		spans.Reset()
		c := startChain(t, never, never, traced)
		if _, err := c.call(context.Background(), "hi"); err != nil {
			t.Fatal(err)
		}
		stubs := waitSpans(t, 1)
		if len(stubs) != 1 || stubs[0].SpanKind != trace.SpanKindServer || stubs[0].Parent.IsValid() {
			t.Errorf("spans %v, want B's server span alone, as a root", names(stubs))
		}
		if tp, ok := c.lastSeen(t).md["traceparent"]; ok {
			t.Errorf("B received traceparent %q from callers that never sample", tp)
		}
	})
}
