package accesslog

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// memStream is an in-memory stream: RecvMsg copies out the messages it
// holds, then returns end; SendMsg keeps what it is given.
type memStream struct {
	mu   sync.Mutex
	in   []*echopb.Echo
	end  error
	sent []any
}

func (s *memStream) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, m)
	return nil
}

func (s *memStream) RecvMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.in) == 0 {
		return s.end
	}
	*m.(*echopb.Echo) = echopb.Echo{Text: s.in[0].Text, Payload: s.in[0].Payload}
	s.in = s.in[1:]
	return nil
}

// echoes is n messages of text.
func echoes(n int, text string) []*echopb.Echo {
	out := make([]*echopb.Echo, n)
	for i := range out {
		out[i] = &echopb.Echo{Text: text}
	}
	return out
}

// bidi is next as a bidirectional handler: it sends sends messages from a
// goroutine of its own while it receives until the end, then returns
// result.
func bidi(sends int, result error) kernel.StreamInvoker {
	return func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		var wg sync.WaitGroup
		wg.Go(func() {
			for range sends {
				_ = st.SendMsg(&echopb.Echo{Text: "out"})
			}
		})
		for {
			if err := st.RecvMsg(new(echopb.Echo)); err != nil {
				break
			}
		}
		wg.Wait()
		info.Attempt = 1
		return result
	}
}

func stream(f *Filter, side kernel.Side, st kernel.Stream, next kernel.StreamInvoker) error {
	info := &kernel.CallInfo{Method: "Chat.Talk", Side: side, Peer: "10.0.0.1:7000"}
	return f.InvokeStream(context.Background(), info, st, next)
}

// One line per stream, at its end, with the messages and bytes each way,
// counted while one goroutine sends and another receives (run with -race).
func TestOneLinePerStream(t *testing.T) {
	var out lines
	f := build(t, nil, &out)
	in := &echopb.Echo{Text: "in"}
	st := &memStream{in: echoes(40, "in"), end: io.EOF}
	if err := stream(f, kernel.ClientSide, st, bidi(25, nil)); err != nil {
		t.Fatal(err)
	}
	got := out.all(t)
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	l := got[0]
	for k, want := range map[string]any{
		"level": "INFO", "msg": "stream", "side": "client", "method": "Chat.Talk", "peer": "10.0.0.1:7000", "attempt": 1.0,
		"code": "OK", "sent_msgs": 25.0, "recv_msgs": 40.0,
		"sent_bytes": float64(25 * (&echopb.Echo{Text: "out"}).SizeVT()), "recv_bytes": float64(40 * in.SizeVT()),
	} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v (line %v)", k, l[k], want, l)
		}
	}
	if _, ok := l["duration"]; !ok {
		t.Errorf("no duration: %v", l)
	}
	if len(st.sent) != 25 {
		t.Errorf("%d messages reached the stream, want 25", len(st.sent))
	}
}

func TestFailedStreamsAlwaysLogged(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0}, &out)
	failure := kernel.Errorf(kernel.PermissionDenied, "not yours")
	if err := stream(f, kernel.ServerSide, &memStream{in: echoes(2, "x"), end: io.EOF}, bidi(1, failure)); err != failure {
		t.Fatalf("InvokeStream = %v, want the handler's %v", err, failure)
	}
	if err := stream(f, kernel.ServerSide, &memStream{end: io.EOF}, bidi(0, nil)); err != nil {
		t.Fatal(err)
	}
	got := out.all(t)
	if len(got) != 1 {
		t.Fatalf("%d lines, want the failure's only (sample 0): %v", len(got), got)
	}
	for k, want := range map[string]any{"level": "WARN", "side": "server", "code": "PermissionDenied", "err": "not yours",
		"sent_msgs": 1.0, "recv_msgs": 2.0} {
		if got[0][k] != want {
			t.Errorf("%s = %v, want %v (line %v)", k, got[0][k], want, got[0])
		}
	}
	if _, ok := got[0]["attempt"]; ok {
		t.Errorf("a server line with an attempt: %v", got[0])
	}
}

func TestSlowAndSampledStreams(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0.5, "slow": "5ms", "level": "DEBUG"}, &out)
	draws := []float64{0.9, 0.1, 0.9}
	f.rand = func() float64 { d := draws[0]; draws = draws[1:]; return d }
	for range 2 {
		_ = stream(f, kernel.ServerSide, &memStream{end: io.EOF}, bidi(0, nil)) // drawn out, then in
	}
	_ = stream(f, kernel.ServerSide, &memStream{end: io.EOF}, func(context.Context, *kernel.CallInfo, kernel.Stream) error {
		time.Sleep(6 * time.Millisecond)
		return nil
	})
	got := out.all(t)
	if len(got) != 2 || got[0]["level"] != "DEBUG" {
		t.Fatalf("lines %v; want the sampled stream's and the slow one's, at DEBUG", got)
	}
}

// Messages that report no size give no byte count that way; failed sends
// and receives are not counted.
func TestUnsizedAndFailedMessages(t *testing.T) {
	var out lines
	f := build(t, nil, &out)
	refusing := &refusingStream{memStream: memStream{in: echoes(3, "in"), end: io.EOF}}
	err := stream(f, kernel.ServerSide, refusing, func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		_ = st.SendMsg("unsized")
		_ = st.SendMsg(&echopb.Echo{Text: "refused"})
		for st.RecvMsg(new(echopb.Echo)) == nil {
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l := out.all(t)[0]
	if l["sent_msgs"] != 1.0 || l["recv_msgs"] != 3.0 {
		t.Errorf("sent_msgs %v, recv_msgs %v; want 1 (one send refused) and 3", l["sent_msgs"], l["recv_msgs"])
	}
	if _, ok := l["sent_bytes"]; ok {
		t.Errorf("sent_bytes with an unsized message sent: %v", l)
	}
	if l["recv_bytes"] != float64(3*(&echopb.Echo{Text: "in"}).SizeVT()) {
		t.Errorf("recv_bytes %v (line %v)", l["recv_bytes"], l)
	}
}

// refusingStream refuses to send an *echopb.Echo whose text is "refused".
type refusingStream struct{ memStream }

func (s *refusingStream) SendMsg(m any) error {
	if e, ok := m.(*echopb.Echo); ok && e.Text == "refused" {
		return errors.New("no credit")
	}
	return s.memStream.SendMsg(m)
}

// sizeCounter reports its size and counts how often it is asked.
type sizeCounter struct{ asked *atomic.Int32 }

func (s sizeCounter) Size() int { s.asked.Add(1); return 10 }

// With the logger off at both levels, the messages' sizes are not asked
// for, and nothing is logged; with it on, each is asked once.
func TestNoSizesWhenNothingWouldBeLogged(t *testing.T) {
	var out lines
	var asked atomic.Int32
	send := func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		return st.SendMsg(sizeCounter{&asked})
	}
	quiet, err := New(&Options{Sample: 1, Level: "INFO", ErrorLevel: "WARN",
		Logger: slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	_ = stream(quiet.(*Filter), kernel.ServerSide, &memStream{end: io.EOF}, send)
	if n := asked.Load(); n != 0 {
		t.Errorf("the size was asked %d times by a filter whose logger drops both its levels", n)
	}
	if got := out.all(t); len(got) != 0 {
		t.Errorf("lines %v from a logger at ERROR", got)
	}
	_ = stream(build(t, nil, &out), kernel.ServerSide, &memStream{end: io.EOF}, send)
	if n := asked.Load(); n != 1 {
		t.Errorf("the size was asked %d times by a filter that logs, want 1", n)
	}
	if got := out.all(t); len(got) != 1 || got[0]["sent_bytes"] != 10.0 {
		t.Errorf("lines %v, want one with sent_bytes=10", got)
	}
}
