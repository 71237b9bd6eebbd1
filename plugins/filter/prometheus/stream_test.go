package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// memStream hands out incoming messages on RecvMsg, then io.EOF, and
// refuses sends once it holds limit of them (limit < 0: never).
type memStream struct {
	mu       sync.Mutex
	incoming int
	sent     int
	limit    int
}

func (s *memStream) SendMsg(any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit >= 0 && s.sent >= s.limit {
		return kernel.Errorf(kernel.Unavailable, "the peer is gone")
	}
	s.sent++
	return nil
}

func (s *memStream) RecvMsg(any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.incoming == 0 {
		return io.EOF
	}
	s.incoming--
	return nil
}

// talk is next as a bidirectional handler: it tries sends messages from a
// goroutine of its own while it receives until the end, then returns
// result.
func talk(sends int, result error) kernel.StreamInvoker {
	return func(_ context.Context, _ *kernel.CallInfo, st kernel.Stream) error {
		var wg sync.WaitGroup
		wg.Go(func() {
			for range sends {
				_ = st.SendMsg("m")
			}
		})
		for st.RecvMsg(new(string)) == nil {
		}
		wg.Wait()
		return result
	}
}

func streamOf(f interface {
	InvokeStream(context.Context, *kernel.CallInfo, kernel.Stream, kernel.StreamInvoker) error
}, method string, side kernel.Side, st kernel.Stream, next kernel.StreamInvoker) error {
	return f.InvokeStream(context.Background(), &kernel.CallInfo{Method: method, Side: side}, st, next)
}

// Streams are counted when they start and, by code, when they end, and
// their messages each way, counted while one goroutine sends and another
// receives (run with -race); a send the stream refuses is not counted.
// Calls and streams keep families of their own.
func TestStreamCounts(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	for range 3 {
		if err := streamOf(f, "Chat.Talk", kernel.ServerSide, &memStream{incoming: 10, limit: -1}, talk(7, nil)); err != nil {
			t.Fatal(err)
		}
	}
	denied := kernel.Errorf(kernel.PermissionDenied, "no")
	if err := streamOf(f, "Chat.Talk", kernel.ServerSide, &memStream{incoming: 2, limit: 4}, talk(9, denied)); err != denied {
		t.Fatalf("InvokeStream = %v, want next's %v", err, denied)
	}
	_ = streamOf(f, "Chat.Talk", kernel.ClientSide, &memStream{incoming: 1, limit: -1}, talk(1, fmt.Errorf("wrapped: %w", kernel.Errorf(kernel.Aborted, "x"))))

	body, fams := scrape(t, serve(t, f.Handler()))
	talkLabels := labels{"service": "Chat", "method": "Talk"}
	for _, c := range []struct {
		name string
		l    labels
		want float64
	}{
		{"kernrpc_server_streams_started_total", talkLabels, 4},
		{"kernrpc_server_streams_ended_total", labels{"service": "Chat", "method": "Talk", "code": "OK"}, 3},
		{"kernrpc_server_streams_ended_total", labels{"service": "Chat", "method": "Talk", "code": "PermissionDenied"}, 1},
		{"kernrpc_server_streams_in_flight", talkLabels, 0},
		{"kernrpc_server_stream_messages_sent_total", talkLabels, 3*7 + 4},
		{"kernrpc_server_stream_messages_received_total", talkLabels, 3*10 + 2},
		{"kernrpc_client_streams_started_total", talkLabels, 1},
		{"kernrpc_client_streams_ended_total", labels{"method": "Talk", "code": "Aborted"}, 1},
		{"kernrpc_client_stream_messages_sent_total", talkLabels, 1},
		{"kernrpc_client_stream_messages_received_total", talkLabels, 1},
	} {
		if got := value(t, fams, c.name, c.l); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.l, got, c.want)
		}
	}
	if n := len(fams["kernrpc_server_streams_ended_total"].GetMetric()); n != 2 {
		t.Errorf("%d kernrpc_server_streams_ended_total series, want 2 (OK and PermissionDenied)", n)
	}
	for _, name := range []string{"kernrpc_server_calls_total", "kernrpc_client_calls_total", "kernrpc_server_call_duration_seconds"} {
		if _, ok := fams[name]; ok {
			t.Errorf("streams alone made %s", name)
		}
	}
	promtool(t, body)
}

// A stream is in flight while next runs, and no longer once it returned,
// its messages counted as they pass, before it ends.
func TestStreamsInFlight(t *testing.T) {
	f := build(t, nil)
	url := serve(t, f.Handler())
	entered, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_ = streamOf(f, "Chat.Watch", kernel.ClientSide, &memStream{incoming: 5, limit: -1}, func(_ context.Context, _ *kernel.CallInfo, st kernel.Stream) error {
				for st.RecvMsg(new(string)) == nil {
				}
				entered <- struct{}{}
				<-release
				return nil
			})
		})
	}
	<-entered
	<-entered
	watch := labels{"service": "Chat", "method": "Watch"}
	_, fams := scrape(t, url)
	if got := value(t, fams, "kernrpc_client_streams_in_flight", watch); got != 2 {
		t.Errorf("in flight while 2 streams are open: %g", got)
	}
	if got := value(t, fams, "kernrpc_client_stream_messages_received_total", watch); got != 10 {
		t.Errorf("messages received by open streams: %g, want 10", got)
	}
	if _, ok := fams["kernrpc_client_streams_ended_total"]; ok {
		t.Error("streams still open counted as ended")
	}
	close(release)
	wg.Wait()
	_, fams = scrape(t, url)
	if got := value(t, fams, "kernrpc_client_streams_in_flight", watch); got != 0 {
		t.Errorf("in flight once they ended: %g", got)
	}
	if got := value(t, fams, "kernrpc_client_streams_ended_total", labels{"method": "Watch", "code": "OK"}); got != 2 {
		t.Errorf("streams ended OK: %g, want 2", got)
	}
}

// A handler that panics ends its stream as Internal.
func TestPanicEndsTheStream(t *testing.T) {
	f := build(t, nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go through the filter")
			}
		}()
		_ = streamOf(f, "Chat.Boom", kernel.ServerSide, &memStream{limit: -1}, func(context.Context, *kernel.CallInfo, kernel.Stream) error {
			panic("boom")
		})
	}()
	_, fams := scrape(t, serve(t, f.Handler()))
	if got := value(t, fams, "kernrpc_server_streams_in_flight", labels{"method": "Boom"}); got != 0 {
		t.Errorf("in flight after a panic: %g, want 0", got)
	}
	if got := value(t, fams, "kernrpc_server_streams_ended_total", labels{"method": "Boom", "code": "Internal"}); got != 1 {
		t.Errorf("streams ended by a panic counted as Internal: %g, want 1", got)
	}
}

// max_methods bounds the streaming methods too, apart from the calls'.
func TestMaxMethodsOfStreams(t *testing.T) {
	f := build(t, map[string]any{"max_methods": 2})
	for i := range 4 {
		_ = streamOf(f, fmt.Sprintf("Svc.S%d", i), kernel.ServerSide, &memStream{incoming: 1, limit: -1}, talk(0, nil))
	}
	served(f, "Svc.Unary", answer(1, 0, nil))
	_, fams := scrape(t, serve(t, f.Handler()))
	if got := len(fams["kernrpc_server_streams_started_total"].GetMetric()); got != 3 {
		t.Errorf("%d stream series, want 3: two methods and _other", got)
	}
	for m, want := range map[string]float64{"S0": 1, "S1": 1, "_other": 2} {
		if got := value(t, fams, "kernrpc_server_stream_messages_received_total", labels{"method": m}); got != want {
			t.Errorf("method %s: %g messages, want %g", m, got, want)
		}
	}
	if got := value(t, fams, "kernrpc_server_calls_total", labels{"method": "Unary"}); got != 1 {
		t.Errorf("a call past the streams' max_methods: %g, want 1 under its own name", got)
	}
}

// A stream on neither side (a CallInfo the engine never makes) passes
// through uncounted.
func TestStreamOfNoSide(t *testing.T) {
	f := build(t, nil)
	want := errors.New("passed")
	if err := streamOf(f, "Chat.Talk", 0, &memStream{}, func(context.Context, *kernel.CallInfo, kernel.Stream) error { return want }); err != want {
		t.Fatalf("InvokeStream = %v, want next's", err)
	}
	_, fams := scrape(t, serve(t, f.Handler()))
	for name := range fams {
		if name == "kernrpc_server_streams_started_total" || name == "kernrpc_client_streams_started_total" {
			t.Errorf("a stream of no side counted in %s", name)
		}
	}
}
