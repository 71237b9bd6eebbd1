package kernrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"google.golang.org/protobuf/proto"
)

// Each test here fails when the server limit it names is removed;
// docs/reliability.md lists them.

func echoRequest(t *testing.T, id uint64, method string, payload []byte) *kernel.Frame {
	t.Helper()
	b, err := proto.Marshal(&echopb.Echo{Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	return &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: id, Method: method, Codec: "protobuf", Payload: b}
}

func readFrame(t *testing.T, c kernel.Conn, within time.Duration) (*kernel.Frame, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return c.ReadFrame(ctx)
}

// countingServer starts a server whose Echo.Count counts its runs in runs
// and holds a call whose payload is "hold" until release is closed, and
// returns a raw connection to it.
func countingServer(t *testing.T) (c kernel.Conn, runs *atomic.Int32, release chan struct{}) {
	runs, release = new(atomic.Int32), make(chan struct{})
	srv := startServer(t, testConfig(t), func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Count", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			runs.Add(1)
			if string(req.Payload) == "hold" {
				<-release
			}
			return req, nil
		})
	})
	return rawConn(t, srv.Addr()), runs, release
}

// A request whose call id was already used on its connection (a frame
// sent twice) is dropped: the call keeps its one answer and its handler
// runs once, whether the first copy is still running or done.
func TestDuplicatedRequestRunsOnceAndGetsOneAnswer(t *testing.T) {
	c, runs, release := countingServer(t)
	// In flight: the copy arrives while the first still runs.
	if err := c.WriteFrame(echoRequest(t, 7, "Echo.Count", []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFrame(echoRequest(t, 7, "Echo.Count", []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	// Done: copies of calls 7 and 8 after their answers.
	resp := roundTripRaw(t, c, echoRequest(t, 8, "Echo.Count", nil))
	answers := map[uint64]int{resp.CallID: 1}
	resp.Release()
	for range 2 {
		if err := c.WriteFrame(echoRequest(t, 7, "Echo.Count", nil)); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFrame(echoRequest(t, 8, "Echo.Count", nil)); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh id still gets through, and no duplicate's answer came first.
	if err := c.WriteFrame(echoRequest(t, 9, "Echo.Count", nil)); err != nil {
		t.Fatal(err)
	}
	// Call 7's answer comes from the goroutine its held handler ran on,
	// which a loaded machine may schedule after 8 and 9 were answered:
	// read until all three are in, then a while longer for any second one.
	for answers[7] == 0 || answers[8] == 0 || answers[9] == 0 {
		f, err := readFrame(t, c, 5*time.Second)
		if err != nil {
			t.Fatalf("waiting for the answers to 7, 8 and 9 (have %v): %v", answers, err)
		}
		answers[f.CallID]++
		f.Release()
	}
	for {
		f, err := readFrame(t, c, 100*time.Millisecond)
		if err != nil {
			break
		}
		answers[f.CallID]++
		f.Release()
	}
	if answers[7] != 1 || answers[8] != 1 || answers[9] != 1 {
		t.Fatalf("answers per call id: %v; want exactly one each for 7, 8 and 9", answers)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times for 3 calls sent 7 times; a duplicated request must never run again", n)
	}
}

// A request whose id 4096 later ones overtook (a caller stalled between
// numbering and writing it) was never used: it is refused unprocessed and
// retryable, not dropped as a duplicate and left unanswered; one id
// nearer is still in the window, and served. A copy of a call that still
// runs, as late, is still dropped.
func TestALateCallIDIsRefusedUnprocessedUnlessItsCallRuns(t *testing.T) {
	c, runs, release := countingServer(t)
	if err := c.WriteFrame(echoRequest(t, 1, "Echo.Count", []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	resp := roundTripRaw(t, c, echoRequest(t, 5000, "Echo.Count", nil))
	resp.Release()
	// A copy of 1, still running; 904 and 905, never sent.
	for _, id := range []uint64{1, 5000 - 4096, 5000 - 4095} {
		if err := c.WriteFrame(echoRequest(t, id, "Echo.Count", nil)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		f, err := readFrame(t, c, 5*time.Second)
		if err != nil {
			t.Fatalf("calls 904 and 905, overtaken by 4096 and 4095 others, did not both get an answer: %v", err)
		}
		switch {
		case f.CallID == 905 && f.Code != kernel.OK:
			t.Errorf("call 905, 4095 below the highest, got %v %q; want it served", f.Code, f.Message)
		case f.CallID == 904 && (f.Code != kernel.ResourceExhausted || f.Flags&kernel.FlagRetryable == 0 || !strings.Contains(f.Message, "4096 or more below")):
			t.Errorf("call 904 got %v %q (retryable %v); want it refused unprocessed, ResourceExhausted and retryable",
				f.Code, f.Message, f.Flags&kernel.FlagRetryable != 0)
		case f.CallID != 904 && f.CallID != 905:
			t.Fatalf("got an answer to call %d (%v); want calls 904 and 905 answered first", f.CallID, f.Code)
		}
		f.Release()
	}
	close(release)
	f := nextFrame(t, c)
	if f.CallID != 1 || f.Code != kernel.OK {
		t.Fatalf("got call %d: %v %q; want the held call 1 answered", f.CallID, f.Code, f.Message)
	}
	f.Release()
	if f, err := readFrame(t, c, 100*time.Millisecond); err == nil {
		t.Fatalf("a further answer, to call %d: the copy of call 1 got one", f.CallID)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times; want 3 (calls 1, 5000 and 905)", n)
	}
}

// The replay window takes call ids up to the largest a frame carries: a
// peer numbering its calls up to 1<<64-1 (a buggy or hostile one) gets
// each answered, and the connection reads on, rather than a read loop
// that counts past the top for ever holding the connection's lock.
func TestCallIDsAtTheTopOfTheRangeAreServed(t *testing.T) {
	c, runs, _ := countingServer(t)
	for _, id := range []uint64{1<<64 - 2, 1<<64 - 1} {
		if err := c.WriteFrame(echoRequest(t, id, "Echo.Count", nil)); err != nil {
			t.Fatal(err)
		}
		f, err := readFrame(t, c, 5*time.Second)
		if err != nil {
			t.Fatalf("no answer to call id %d: %v", id, err)
		}
		if f.CallID != id || f.Code != kernel.OK {
			t.Fatalf("call id %d got an answer to %d: %v %q; want it served", id, f.CallID, f.Code, f.Message)
		}
		f.Release()
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times; want 2", n)
	}
}

func TestRequestsOverMaxConcurrentCallsAreRefusedUnprocessed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.MaxConcurrentCalls = 4
	retries := 0
	cfg.Client.Retries = &retries
	var running, peak atomic.Int32
	release := make(chan struct{})
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			return req, nil
		})
	})
	_ = srv
	cli := newClient(t, cfg)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			var resp echopb.Echo
			errs <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &resp)
		})
	}
	// The four over the limit come back at once, while four are held.
	for range 4 {
		err := receive(t, errs, 5*time.Second, "a call over max_concurrent_calls was not refused at once")
		if kernel.CodeOf(err) != kernel.ResourceExhausted || !kernel.IsRetryable(err) || !strings.Contains(err.Error(), "max_concurrent_calls") {
			t.Fatalf("call over the limit: %v; want ResourceExhausted, unprocessed, naming server.max_concurrent_calls", err)
		}
	}
	// An admitted call is counted before its handler starts: wait for the
	// four to be running, so that a late one cannot miss the others.
	eventually(5*time.Second, func() bool { return running.Load() >= 4 })
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call within the limit failed: %v", err)
		}
	}
	if p := peak.Load(); p != 4 {
		t.Fatalf("at most %d handlers ran at once; want exactly the limit, 4", p)
	}
}

func TestConnectionsOverMaxConnectionsAreClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.MaxConnections = 2
	srv := startServer(t, cfg, nil)
	first, second := rawConn(t, srv.Addr()), rawConn(t, srv.Addr())
	for _, c := range []kernel.Conn{first, second} {
		resp := roundTripRaw(t, c, echoRequest(t, 1, "Echo.Echo", []byte("x")))
		resp.Release()
	}
	// The third is told why, with a GoAway naming no call served, and
	// closed; its request is not served.
	third := rawConn(t, srv.Addr())
	_ = third.WriteFrame(echoRequest(t, 1, "Echo.Echo", nil))
	f, err := readFrame(t, third, 5*time.Second)
	if err != nil {
		t.Fatalf("the connection over max_connections ended with %v before any GoAway; want a GoAway saying max_connections", err)
	}
	if f.Type != kernel.FrameGoAway || f.CallID != 0 || f.Message != "max_connections" {
		t.Fatalf("got %v (call id %d, %q); want a GoAway naming no call served, saying max_connections", f.Type, f.CallID, f.Message)
	}
	f.Release()
	if f, err := readFrame(t, third, 5*time.Second); err == nil {
		f.Release()
		t.Fatalf("a connection over max_connections got a %v (call id %d) after its GoAway", f.Type, f.CallID)
	} else if !errors.Is(err, kernel.ErrPeerGone) && !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("the third connection ended with %v; want the server to have closed it", err)
	}
	// Once one closes, a new one is taken again.
	_ = first.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := rawConn(t, srv.Addr())
		_ = c.WriteFrame(echoRequest(t, 1, "Echo.Echo", nil))
		f, err := readFrame(t, c, time.Second)
		if err == nil {
			f.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection was taken after one of the two closed: %v", err)
		}
	}
}

// A call that finds the server at max_connections fails as unprocessed
// (Unavailable, retryable: another instance may take it), saying why,
// not as a connection lost under it.
func TestACallOverMaxConnectionsIsRefusedUnprocessedSayingWhy(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.MaxConnections = 1
	retries := 0
	cfg.Client.Retries = &retries
	srv := startServer(t, cfg, nil)
	held := rawConn(t, srv.Addr())
	resp := roundTripRaw(t, held, echoRequest(t, 1, "Echo.Echo", []byte("x")))
	resp.Release()
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Unavailable || !kernel.IsRetryable(err) || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("a call over max_connections: %v (retryable %v); want Unavailable, retryable, naming max_connections", err, kernel.IsRetryable(err))
	}
}

func TestIdleConnectionGetsAGoAwayAndIsClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.IdleTimeout = kernel.Duration(150 * time.Millisecond)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Slow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			time.Sleep(500 * time.Millisecond)
			return req, nil
		})
	})
	// A call longer than the idle timeout keeps its connection.
	busy := rawConn(t, srv.Addr())
	resp := roundTripRaw(t, busy, echoRequest(t, 1, "Echo.Slow", nil))
	if resp.Type != kernel.FrameResponse || resp.Code != kernel.OK {
		t.Fatalf("the slow call ended as %v %v %q", resp.Type, resp.Code, resp.Message)
	}
	resp.Release()
	// Then, idle, it gets a GoAway naming no last call, saying
	// idle_timeout (this connection only); and once the client answers
	// that it sent one request, it is closed without a second GoAway.
	start := time.Now()
	f, err := readFrame(t, busy, 5*time.Second)
	if err != nil {
		t.Fatalf("no GoAway before the close: %v", err)
	}
	if f.Type != kernel.FrameGoAway || f.CallID != kernel.GoAwayUnknownLast || f.Message != "idle_timeout" {
		t.Fatalf("got %v (call id %d, %q); want a GoAway naming no last call, saying idle_timeout", f.Type, f.CallID, f.Message)
	}
	f.Release()
	if err := busy.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if f, err := readFrame(t, busy, 5*time.Second); err == nil {
		t.Fatalf("got %v (call id %d) where the idle connection should have closed", f.Type, f.CallID)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("closed %s after going idle; want within two idle timeouts plus the close grace", took)
	}
	// A client on the same server just dials again.
	cli := newClient(t, cfg)
	var out echopb.Echo
	for i := range 3 {
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &out); err != nil {
			t.Fatalf("call %d around idle closes: %v", i, err)
		}
		time.Sleep(400 * time.Millisecond)
	}
}

// A stream opened and a call sent on an idle connection as its first
// GoAway left are served, not refused; then the connection is closed.
func TestAStreamRacingAnIdleConnectionsGoAwayIsServed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.IdleTimeout = kernel.Duration(150 * time.Millisecond)
	srv := startServer(t, cfg, streamHandlers)
	c := rawConn(t, srv.Addr())
	f := nextFrame(t, c)
	if f.Type != kernel.FrameGoAway || f.Message != "idle_timeout" {
		t.Fatalf("got %v (%q); want the idle connection's GoAway", f.Type, f.Message)
	}
	if f.CallID != kernel.GoAwayUnknownLast {
		t.Errorf("the idle connection's first GoAway names call %d the last served; want none named", f.CallID)
	}
	msg, err := proto.Marshal(&echopb.Echo{Text: "2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*kernel.Frame{
		{Type: kernel.FrameWindowUpdate, Credit: 1 << 20},
		{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: 1, Method: "Count.Up", Codec: "protobuf", Credit: 1 << 20},
		{Type: kernel.FrameStreamData, CallID: 1, Payload: msg},
		{Type: kernel.FrameStreamData, Flags: kernel.FlagEndStream, CallID: 1},
		echoRequest(t, 2, "Echo.Echo", nil),
		{Type: kernel.FrameGoAway, CallID: 2},
	} {
		if err := c.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	msgs, answers := 0, 0
	for {
		f, err := readFrame(t, c, 5*time.Second)
		if err != nil {
			break // closed once idle again
		}
		switch f.Type {
		case kernel.FrameStreamData:
			msgs++
		case kernel.FrameResponse:
			answers++
			if f.Code != kernel.OK {
				t.Errorf("call %d answered %v %q; want it served", f.CallID, f.Code, f.Message)
			}
		case kernel.FrameGoAway:
			t.Errorf("a second GoAway (last call %d) though the client answered", f.CallID)
		}
		f.Release()
	}
	if msgs != 2 || answers != 2 {
		t.Errorf("got %d stream messages and %d answers; want 2 and 2", msgs, answers)
	}
}

// An answer the transport refuses (larger than max_frame_size) reaches
// the caller at once as ResourceExhausted, instead of leaving it to wait
// for its deadline; the connection carries on.
func TestAnswerOverTheFrameLimitReachesTheCallerAsResourceExhausted(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Options["max_frame_size"] = "64KiB"
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Grow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return &echopb.Echo{Payload: make([]byte, 100<<10)}, nil
		})
		kernrpc.Handle(s, "Echo.LongError", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, kernel.Errorf(kernel.NotFound, "no such name %q", strings.Repeat("\x00binary", 20<<10))
		})
	})
	cli := newClient(t, cfg)
	for _, method := range []string{"Echo.Grow", "Echo.LongError"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		var out echopb.Echo
		err := cli.Call(ctx, method, &echopb.Echo{}, &out)
		cancel()
		took := time.Since(start)
		if took > 2*time.Second {
			t.Fatalf("%s: the caller waited %s for an answer the server could not send", method, took)
		}
		switch method {
		case "Echo.Grow":
			if kernel.CodeOf(err) != kernel.ResourceExhausted || !strings.Contains(err.Error(), "max_frame_size") {
				t.Fatalf("%s: %v; want ResourceExhausted naming max_frame_size", method, err)
			}
		case "Echo.LongError":
			// The handler's code survives; its message is cut to fit.
			if kernel.CodeOf(err) != kernel.NotFound || len(err.Error()) > 20<<10 {
				t.Fatalf("%s: code %v, %d-byte message; want NotFound with the message cut", method, kernel.CodeOf(err), len(err.Error()))
			}
		}
	}
	var out echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Payload: []byte("after")}, &out); err != nil || string(out.Payload) != "after" {
		t.Fatalf("the connection after the refused answers: %v", err)
	}
}
