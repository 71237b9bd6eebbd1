package kernrpc_test

import (
	"context"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"google.golang.org/protobuf/proto"
)

// A shutdown drains in two steps (server_drain.go): these tests play the
// client, or the server, with the transport alone.

func mustMarshal(t *testing.T, m *echopb.Echo) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nextFrame reads c's next frame, failing t if none comes.
func nextFrame(t *testing.T, c kernel.Conn) *kernel.Frame {
	t.Helper()
	f, err := readFrame(t, c, 5*time.Second)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return f
}

func shutdownInBackground(srv *kernrpc.Server) <-chan error {
	down := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		down <- srv.Shutdown(ctx)
	}()
	return down
}

// shutdownWithACallHeld starts a server whose Echo.Hold answers once free
// is called (at the latest as t ends, before the server's own cleanup),
// sends it that call over a raw connection, begins its shutdown, and reads
// the first GoAway: one naming no last call, since a call is in flight.
func shutdownWithACallHeld(t *testing.T) (c kernel.Conn, down <-chan error, free func()) {
	release := make(chan struct{})
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	srv := startServer(t, testConfig(t), func(s *kernrpc.Server) {
		streamHandlers(s)
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			<-release
			return req, nil
		})
	})
	t.Cleanup(free)
	c = rawConn(t, srv.Addr())
	if err := c.WriteFrame(echoRequest(t, 1, "Echo.Hold", nil)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the call is in flight when the shutdown begins
	down = shutdownInBackground(srv)
	if f := nextFrame(t, c); f.Type != kernel.FrameGoAway || f.CallID != kernel.GoAwayUnknownLast || f.Message != "" {
		t.Fatalf("got %v (call id %d, %q); want a GoAway naming no last call", f.Type, f.CallID, f.Message)
	}
	return c, down, free
}

// A stream opened, and a call sent, after the server's first GoAway left
// but before the client read it, are served, not refused: the client's
// GoAway says how many requests to wait for, and once they are in, no
// second GoAway is needed.
func TestShutdownServesWhatTheClientSentBeforeItHeard(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	c, down, free := shutdownWithACallHeld(t)
	for _, f := range []*kernel.Frame{
		{Type: kernel.FrameWindowUpdate, Credit: 1 << 20},
		{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: 2, Method: "Count.Up", Codec: "protobuf", Credit: 1 << 20},
		{Type: kernel.FrameStreamData, CallID: 2, Payload: mustMarshal(t, &echopb.Echo{Text: "3"})},
		{Type: kernel.FrameStreamData, Flags: kernel.FlagEndStream, CallID: 2},
		echoRequest(t, 3, "Echo.Echo", nil),
		{Type: kernel.FrameGoAway, CallID: 3},
	} {
		if err := c.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	free()
	var msgs []string
	answered := map[uint64]kernel.Code{}
	for len(answered) < 3 {
		f := nextFrame(t, c)
		switch f.Type {
		case kernel.FrameStreamData:
			var m echopb.Echo
			if err := proto.Unmarshal(f.Payload, &m); err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m.Text)
		case kernel.FrameResponse:
			answered[f.CallID] = f.Code
			if f.Code != kernel.OK {
				t.Errorf("call %d answered %v %q; want it served", f.CallID, f.Code, f.Message)
			}
		case kernel.FrameGoAway:
			t.Errorf("a second GoAway (last call %d) though the client said it had stopped", f.CallID)
		}
		f.Release()
	}
	if want := []string{"0", "1", "2"}; len(msgs) != 3 || msgs[0] != want[0] || msgs[2] != want[2] {
		t.Errorf("stream sent %q; want %q", msgs, want)
	}
	if err := receive(t, down, 10*time.Second, "Shutdown did not return"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := logs.String(); !strings.Contains(got, "unanswered=0") {
		t.Errorf("the shutdown's log counts a client that did not answer; it answered (want unanswered=0):\n%s", got)
	}
}

// A client that never answers the first GoAway gets, after the wait, one
// naming the last call served; what it sends after that is refused as
// retryable, and the shutdown ends. Its log line counts the client.
func TestShutdownRefusesWhatComesAfterAClientThatDoesNotAnswer(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	c, down, free := shutdownWithACallHeld(t)
	if f := nextFrame(t, c); f.Type != kernel.FrameGoAway || f.CallID != 1 || f.Message != "" {
		t.Fatalf("got %v (call id %d, %q); want a GoAway naming call 1 the last served", f.Type, f.CallID, f.Message)
	}
	f := roundTripRaw(t, c, echoRequest(t, 2, "Echo.Echo", nil))
	if f.Type != kernel.FrameResponse || f.Code != kernel.Unavailable || f.Flags&kernel.FlagRetryable == 0 {
		t.Errorf("late call: %v %v %q (flags %v); want Unavailable, retryable", f.Type, f.Code, f.Message, f.Flags)
	}
	free()
	if f := nextFrame(t, c); f.Type != kernel.FrameResponse || f.CallID != 1 || f.Code != kernel.OK {
		t.Errorf("the held call: %v %d %v %q; want it served", f.Type, f.CallID, f.Code, f.Message)
	}
	if err := receive(t, down, 10*time.Second, "Shutdown did not return"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := logs.String(); !strings.Contains(got, `msg="shutting down: draining in-flight calls"`) || !strings.Contains(got, "unanswered=1") {
		t.Errorf("the shutdown's log does not count the client that did not answer (unanswered=1):\n%s", got)
	}
}

// goAwayCounter starts a fake server that echoes requests and sends a
// shutdown's first GoAway just before its answer to request number nth
// (while the client waits for that answer, and so reads), and a client of
// it; answered reports the call id of the client's GoAway in reply.
func goAwayCounter(t *testing.T, nth int, transportOptions map[string]any) (cli *kernrpc.Client, answered <-chan uint64) {
	got := make(chan uint64, 1)
	calls := 0 // the fake server's goroutine's
	addr := fakeServer(t, func(f *kernel.Frame) []*kernel.Frame {
		switch f.Type {
		case kernel.FrameRequest:
			resp := &kernel.Frame{Type: kernel.FrameResponse, CallID: f.CallID, Codec: "protobuf", Payload: f.Payload}
			if calls++; calls == nth {
				return []*kernel.Frame{{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast}, resp}
			}
			return []*kernel.Frame{resp}
		case kernel.FrameGoAway:
			select {
			case got <- f.CallID:
			default: // only the first counts
			}
		}
		return nil
	})
	cfg := testConfig(t)
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	maps.Copy(cfg.Transport.Options, transportOptions)
	return newClient(t, cfg), got
}

// The client answers a shutdown's first GoAway with a GoAway counting the
// requests it sent on the connection, and sends no more there.
func TestClientAnswersAShutdownsGoAwayWithItsCount(t *testing.T) {
	cli, answered := goAwayCounter(t, 3, nil)
	for i := range 3 {
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: strconv.Itoa(i)}, &resp); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := receive(t, answered, 5*time.Second, "the client did not answer the GoAway"); n != 3 {
		t.Errorf("the client's GoAway counts %d requests; it sent 3", n)
	}
}

// A request the transport refused whole, sending nothing of it (here its
// metadata is over the transport's limit), took an id but never left: the
// client's answer to a shutdown's GoAway leaves it out of its count, or
// the server would wait for it until the second GoAway.
func TestClientsGoAwayCountLeavesOutRequestsItsTransportRefused(t *testing.T) {
	cli, answered := goAwayCounter(t, 2, map[string]any{"max_metadata_bytes": 100})
	echo := func(ctx context.Context) error {
		var resp echopb.Echo
		return cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "x"}, &resp)
	}
	tooBig := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"k": strings.Repeat("v", 100)})

	if err := echo(context.Background()); err != nil {
		t.Fatalf("call 1: %v", err)
	}
	if err := echo(tooBig); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a call with metadata over max_metadata_bytes: %v; want ResourceExhausted, refused by the transport", err)
	}
	if _, err := cli.NewStream(tooBig, "Echo.Chat"); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a stream with metadata over max_metadata_bytes: %v; want ResourceExhausted, refused by the transport", err)
	}
	if err := echo(context.Background()); err != nil { // answered with the GoAway
		t.Fatalf("call 2: %v", err)
	}
	if n := receive(t, answered, 5*time.Second, "the client did not answer the GoAway"); n != 2 {
		t.Errorf("the client's GoAway counts %d requests; it sent 2 (and numbered 4)", n)
	}
}

// A connection its idle_timeout already took through both steps (its
// client did not answer the first GoAway, and a call that crossed it still
// runs) has no answer left to wait for: a shutdown that begins then must
// not wait drainAckWait (a second) for one.
func TestShutdownDoesNotWaitForAConnectionPastItsIdleDrain(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.IdleTimeout = kernel.Duration(200 * time.Millisecond)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			<-release
			return req, nil
		})
	})
	t.Cleanup(free)
	c := rawConn(t, srv.Addr())
	if f := nextFrame(t, c); f.Type != kernel.FrameGoAway || f.CallID != kernel.GoAwayUnknownLast || f.Message != "idle_timeout" {
		t.Fatalf("got %v (call id %d, %q); want the idle GoAway naming no last call", f.Type, f.CallID, f.Message)
	}
	// A call that crossed the GoAway: served. The client never answers.
	if err := c.WriteFrame(echoRequest(t, 1, "Echo.Hold", nil)); err != nil {
		t.Fatal(err)
	}
	if f := nextFrame(t, c); f.Type != kernel.FrameGoAway || f.CallID != 1 {
		t.Fatalf("got %v (call id %d, %q); want the second idle GoAway naming call 1", f.Type, f.CallID, f.Message)
	}
	start := time.Now()
	down := shutdownInBackground(srv)
	time.Sleep(100 * time.Millisecond)
	free()
	if f := nextFrame(t, c); f.Type != kernel.FrameResponse || f.CallID != 1 || f.Code != kernel.OK {
		t.Fatalf("the held call: %v %d %v %q; want it served", f.Type, f.CallID, f.Code, f.Message)
	}
	_ = c.Close()
	if err := receive(t, down, 10*time.Second, "Shutdown did not return"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	// Waiting for the answer would take drainAckWait, a second, at least.
	if took := time.Since(start); took >= 900*time.Millisecond {
		t.Errorf("Shutdown took %v; its only connection was past its idle drain, and its call ended after 100ms", took)
	}
}

// Clients that stop reading while their answers are being written hold
// those writes for the transport's write_timeout (here 20s). Shutdown's
// context still bounds the shutdown: once it ends, the connections are
// closed at once, all together (each closing takes tcp-lv up to a second
// with its write cut short), not half-closed after the writes give up.
func TestShutdownIsNotHeldByClientsThatDoNotRead(t *testing.T) {
	cfg := testConfig(t)
	maps.Copy(cfg.Transport.Options, map[string]any{"max_frame_size": "64MiB", "max_write_queue": "128MiB", "write_timeout": "20s"})
	srv := startServer(t, cfg, nil)
	// Each answer, as large as its request, is far more than the loopback
	// buffers hold: the server's write blocks, since the client never reads.
	req := echoRequest(t, 1, "Echo.Echo", make([]byte, 8<<20))
	wire := append(kernel.AppendFrameHeader(nil, req), req.Payload...)
	for range 6 {
		raw, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Close() }) // ends the blocked writes, should the test fail
		_ = raw.(*net.TCPConn).SetReadBuffer(64 << 10)
		if _, err := raw.Write(wire); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the answers' writes are under way
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	down := make(chan error, 1)
	go func() { down <- srv.Shutdown(ctx) }()
	// The context's 500ms, and a second for the transport's Close to cut
	// the writes short: far less than write_timeout, or than six seconds
	// one after another.
	err := receive(t, down, 10*time.Second, "Shutdown outlived its context by more than 9.5s: clients that do not read held it")
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Shutdown took %v; its context ended after 500ms", took)
	}
	if err == nil {
		t.Errorf("Shutdown returned nil; the calls it could not answer in time should make it say so")
	}
}
