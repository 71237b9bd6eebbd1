package oteltracing_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

type chatStream = kernrpc.ServerStreamOf[wrapperspb.StringValue, wrapperspb.StringValue]

// chatServer serves the stream Chat.Echo, which answers every message
// with itself until the client closes its side, and calls B.Call once
// with its context at the first message. A message "fail" ends the
// stream with Internal, "refuse" with FailedPrecondition. seen receives
// the span context the handler's context carries.
type chatServer struct {
	srv, b *kernrpc.Server
	mu     sync.Mutex
	seen   []trace.SpanContext
}

func startChat(t *testing.T, filters string) *chatServer {
	t.Helper()
	c := &chatServer{}
	c.b = serve(t, config(t, "b", filters), "B.Call", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return req, nil
	})
	cfg := config(t, "chat", filters)
	toB, err := kernrpc.NewClient(cfg, "b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = toB.Close() })
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.HandleBidiStream(srv, "Chat.Echo", func(ctx context.Context, st chatStream) error {
		c.mu.Lock()
		c.seen = append(c.seen, trace.SpanContextFromContext(ctx))
		c.mu.Unlock()
		for i := 0; ; i++ {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			switch m.GetValue() {
			case "fail":
				return kernel.Errorf(kernel.Internal, "chat broke")
			case "refuse":
				return kernel.Errorf(kernel.FailedPrecondition, "not now")
			}
			if i == 0 {
				if err := toB.Call(ctx, "B.Call", m, new(wrapperspb.StringValue)); err != nil {
					return err
				}
			}
			if err := st.Send(m); err != nil {
				return err
			}
		}
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	c.srv = srv
	return c
}

func (c *chatServer) lastSeen(t *testing.T) trace.SpanContext {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) == 0 {
		t.Fatal("the stream's handler never ran")
	}
	return c.seen[len(c.seen)-1]
}

// chat opens Chat.Echo, sends the texts while reading their echoes, closes
// its side and reads the end, which it returns (nil for OK).
func chat(ctx context.Context, cli *kernrpc.Client, texts ...string) error {
	st, err := kernrpc.OpenStream[wrapperspb.StringValue, wrapperspb.StringValue](ctx, cli, "Chat.Echo")
	if err != nil {
		return err
	}
	for _, text := range texts {
		if err := st.Send(wrapperspb.String(text)); err != nil {
			break // the server ended the stream: Recv says how
		}
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// byKind finds the one span of kind and name among stubs.
func byKind(t *testing.T, stubs tracetest.SpanStubs, kind trace.SpanKind, name string) (tracetest.SpanStub, sdktrace.ReadOnlySpan) {
	t.Helper()
	ro := stubs.Snapshots()
	found := -1
	for i, s := range stubs {
		if s.SpanKind == kind && s.Name == name {
			if found >= 0 {
				t.Fatalf("two %s spans %q: %v", kind, name, names(stubs))
			}
			found = i
		}
	}
	if found < 0 {
		t.Fatalf("no %s span %q: %v", kind, name, names(stubs))
	}
	return stubs[found], ro[found]
}

// Over the engine (tcp-lv): a stream is one client span and one server
// span, in one trace, the server's a child of the client's through the
// trace context in the stream's opening; each counts the messages its
// side sent and received. The attempt entry adds no span to a stream. The
// handler's context carries the server span, so a call it makes is its
// child.
func TestStreamMakesOneSpanPerSide(t *testing.T) {
	spans.Reset()
	c := startChat(t, traced)
	cli, err := kernrpc.NewClient(config(t, "chat", traced), "chat")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	const n = 5
	texts := make([]string, n)
	for i := range texts {
		texts[i] = "m" + strconv.Itoa(i)
	}
	if err := chat(context.Background(), cli, texts...); err != nil {
		t.Fatal(err)
	}
	// The stream's two spans, and the handler's call to B: its call,
	// attempt and server spans. The client's stream span ends once the
	// caller read the end, on the engine's goroutine.
	stubs := waitSpans(t, 5)
	if len(stubs) != 5 {
		t.Fatalf("%d spans, want 5: %v", len(stubs), names(stubs))
	}
	client, cro := byKind(t, stubs, trace.SpanKindClient, "Chat.Echo")
	server, sro := byKind(t, stubs, trace.SpanKindServer, "Chat.Echo")
	bServer, _ := byKind(t, stubs, trace.SpanKindServer, "B.Call")
	bCall, _ := byKind(t, stubs, trace.SpanKindClient, "B.Call")
	tid := client.SpanContext.TraceID()
	for _, s := range stubs {
		if s.SpanContext.TraceID() != tid {
			t.Errorf("span %q (%s) is in trace %s, want %s: not one trace", s.Name, s.SpanKind, s.SpanContext.TraceID(), tid)
		}
	}
	if client.Parent.IsValid() {
		t.Errorf("the client's stream span has parent %s, want none", client.Parent.SpanID())
	}
	if server.Parent.SpanID() != client.SpanContext.SpanID() || !server.Parent.IsRemote() {
		t.Errorf("the server's stream span has parent %s (remote %v), want the client's span %s over the wire",
			server.Parent.SpanID(), server.Parent.IsRemote(), client.SpanContext.SpanID())
	}
	if bCall.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("the handler's call to B has parent %s, want the stream's server span %s", bCall.Parent.SpanID(), server.SpanContext.SpanID())
	}
	if !bServer.Parent.IsRemote() {
		t.Errorf("B's server span's parent is not remote")
	}
	if sc := c.lastSeen(t); sc.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("the handler sees span %s, want its server span %s", sc.SpanID(), server.SpanContext.SpanID())
	}
	checkSpan(t, 0, client, cro, want{"Chat.Echo", trace.SpanKindClient, -1, map[string]any{
		"rpc.system.name": "kernrpc", "rpc.method": "Chat.Echo", "rpc.response.status_code": "OK",
		"server.address": "127.0.0.1", "server.port": port(c.srv.Addr()), "rpc.kernrpc.attempt": int64(1),
		"rpc.kernrpc.messages.sent": int64(n), "rpc.kernrpc.messages.received": int64(n),
	}})
	checkSpan(t, 1, server, sro, want{"Chat.Echo", trace.SpanKindServer, 0, map[string]any{
		"rpc.system.name": "kernrpc", "rpc.method": "Chat.Echo", "rpc.response.status_code": "OK",
		"network.peer.address": "127.0.0.1", "rpc.kernrpc.messages.sent": int64(n), "rpc.kernrpc.messages.received": int64(n),
	}})
	for _, s := range []tracetest.SpanStub{client, server} {
		if s.Status.Code != codes.Unset {
			t.Errorf("span %q (%s) has status %v, want unset", s.Name, s.SpanKind, s.Status)
		}
	}
}

// A stream that fails fails its client span for every code, and its
// server span only for the server's faults, as calls do.
func TestFailedStreamRecordsTheErrorAndCode(t *testing.T) {
	c := startChat(t, traced)
	_ = c
	cli, err := kernrpc.NewClient(config(t, "chat", traced), "chat")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	for _, tc := range []struct {
		text, code   string
		serverStatus codes.Code
	}{
		{"fail", "Internal", codes.Error},
		{"refuse", "FailedPrecondition", codes.Unset},
	} {
		spans.Reset()
		if err := chat(context.Background(), cli, tc.text); kernel.CodeOf(err).String() != tc.code {
			t.Fatalf("%s: the stream ended with %v, want code %s", tc.text, err, tc.code)
		}
		stubs := waitSpans(t, 2)
		if len(stubs) != 2 {
			t.Fatalf("%s: %d spans, want 2: %v", tc.text, len(stubs), names(stubs))
		}
		ro := stubs.Snapshots()
		for i, s := range stubs {
			wantStatus := codes.Error
			if s.SpanKind == trace.SpanKindServer {
				wantStatus = tc.serverStatus
			}
			if s.Status.Code != wantStatus {
				t.Errorf("%s: span %q (%s) has status %v, want %v", tc.text, s.Name, s.SpanKind, s.Status, wantStatus)
			}
			a := attrs(ro[i])
			if got := a["rpc.response.status_code"].AsString(); got != tc.code {
				t.Errorf("%s: span %s: rpc.response.status_code %q, want %q", tc.text, s.SpanKind, got, tc.code)
			}
			if got := a["rpc.kernrpc.messages.received"].AsInt64() + a["rpc.kernrpc.messages.sent"].AsInt64(); got != 1 {
				t.Errorf("%s: span %s counts %d messages, want the one the client sent", tc.text, s.SpanKind, got)
			}
			if wantStatus == codes.Error && (a["error.type"].AsString() != tc.code || len(s.Events) != 1 || s.Events[0].Name != "exception") {
				t.Errorf("%s: span %s: error.type %q, events %v; want %s and the recorded error", tc.text, s.SpanKind, a["error.type"].AsString(), s.Events, tc.code)
			}
		}
	}
}

// A stream the filter does not record passes the caller's trace context
// on as it came, to the handler's context: sampler never, and
// parent-ratio under an unsampled parent.
func TestStreamNotRecordedPassesTheParent(t *testing.T) {
	never := "  - {name: otel-tracing, options: {sampler: never}}\n"
	for _, tc := range []struct {
		name, filters string
		sampled       bool
	}{
		{"never, sampled parent", never, true},
		{"parent-ratio, unsampled parent", traced, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans.Reset()
			c := startChat(t, tc.filters)
			cli, err := kernrpc.NewClient(config(t, "chat", tc.filters), "chat")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cli.Close() })
			ctx, parent := parentCtx(tc.sampled)
			if err := chat(ctx, cli, "hi"); err != nil {
				t.Fatal(err)
			}
			if sc := c.lastSeen(t); !sc.Equal(parent.WithRemote(true)) {
				t.Errorf("the handler has span context %+v, want the caller's %+v", sc, parent)
			}
			if n := len(spans.GetSpans()); n != 0 {
				t.Errorf("%d spans recorded, want none: %v", n, names(spans.GetSpans()))
			}
		})
	}
}
