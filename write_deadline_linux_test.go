package kernrpc_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A server that stops reading fills an shm-ring connection's ring, and a
// writer waits for room up to wait_timeout. A call's deadline bounds that
// wait as it bounds the rest of the call: the request is given up on
// when the deadline passes (DeadlineExceeded, not ResourceExhausted a
// wait_timeout later), and nothing of it reaches the server, so the
// connection serves the next call once the server reads again.
func TestARequestWaitingForRoomEndsAtTheCallsDeadline(t *testing.T) {
	cli, conns := rawShmServer(t, map[string]any{"ring_size": "16KiB", "wait_timeout": "10s"})
	big := &echopb.Echo{Payload: make([]byte, 64<<10)}
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		first <- cli.Call(ctx, "Echo.Echo", big, new(echopb.Echo))
	}()
	c := receive(t, conns, 10*time.Second, "the client never connected")
	if !readUntil(t, c, func(f *kernel.Frame) bool { return f.Type == kernel.FrameRequest }) {
		t.Fatal("the connection ended before the first request")
	}
	// The server reads no more: the first call's deadline passes, and
	// the second's request, four times the ring, finds it full.
	if err := receive(t, first, 10*time.Second, "the first call never ended"); kernel.CodeOf(err) != kernel.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := cli.Call(ctx, "Echo.Echo", big, new(echopb.Echo))
	if waited := time.Since(start); kernel.CodeOf(err) != kernel.DeadlineExceeded || waited > 5*time.Second {
		t.Fatalf("a request finding no room returned %v after %s, want DeadlineExceeded at its 300ms deadline, not wait_timeout's 10s", err, waited)
	}

	// The server reads again: the frame given up on left nothing behind
	// that the next call's request could be mistaken for.
	third := make(chan error, 1)
	var resp echopb.Echo
	go func() { third <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "after"}, &resp) }()
	var id uint64
	if !readUntil(t, c, func(f *kernel.Frame) bool {
		if f.Type == kernel.FrameRequest {
			var req echopb.Echo
			if err := proto.Unmarshal(f.Payload, &req); err != nil || req.Text != "after" {
				t.Fatalf("the server read a request for %s of %d bytes (%v), want the third call's", f.Method, len(f.Payload), err)
			}
			id = f.CallID
			return true
		}
		return false
	}) {
		t.Fatal("the connection ended before the third call's request")
	}
	answerAfter(t, c, id, third, &resp)
}

// A stream's message waiting for room in a full ring ends with the
// stream's context too.
func TestAStreamMessageWaitingForRoomEndsWithTheStreamsContext(t *testing.T) {
	cli, conns := rawShmServer(t, map[string]any{"ring_size": "16KiB", "wait_timeout": "10s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type stream = kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]
	opened := make(chan stream, 1)
	failed := make(chan error, 1)
	go func() {
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Hold")
		if err != nil {
			failed <- err
			return
		}
		opened <- st
	}()
	c := receive(t, conns, 10*time.Second, "the client never connected")
	if !readUntil(t, c, func(f *kernel.Frame) bool { return f.Type == kernel.FrameRequest }) {
		t.Fatal("the connection ended before the stream's request")
	}
	var st stream
	select {
	case st = <-opened:
	case err := <-failed:
		t.Fatalf("open: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never opened")
	}
	for _, f := range []*kernel.Frame{{Type: kernel.FrameWindowUpdate, Credit: 1 << 30}, {Type: kernel.FrameWindowUpdate, CallID: 1, Credit: 1 << 30}} {
		if err := c.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	// Credit enough for a megabyte, a ring of 16 KiB, and a server that
	// reads no more: a Send finds no room, and waits until the caller
	// gives up on the stream.
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	m := &echopb.Echo{Payload: make([]byte, 1<<10)}
	var err error
	for err == nil {
		err = st.Send(m)
	}
	if waited := time.Since(start); kernel.CodeOf(err) != kernel.Canceled || waited > 5*time.Second {
		t.Fatalf("a Send finding no room returned %v after %s, want Canceled when the stream's context ended at 300ms, not wait_timeout's 10s", err, waited)
	}
}

// A call whose deadline passes while the ring to its server is full does
// not wait for room for its Cancel either: it returns at its deadline, and
// the Cancel waits on its own (up to wait_timeout, after which the
// connection is closed, as for any Cancel refused). Two streams fill the
// ring, one with 1 KiB messages, one with empty ones, until there is no
// room for even the smallest frame.
func TestACallWhoseCancelFindsNoRoomReturnsAtItsDeadline(t *testing.T) {
	cli, conns := rawShmServer(t, map[string]any{"ring_size": "16KiB", "wait_timeout": "10s"})
	type stream = kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var c kernel.Conn
	// open opens a stream the server grants credit enough for a gigabyte.
	open := func() stream {
		t.Helper()
		opened := make(chan stream, 1)
		go func() {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Hold")
			if err != nil {
				t.Errorf("open: %v", err)
			}
			opened <- st
		}()
		if c == nil {
			c = receive(t, conns, 10*time.Second, "the client never connected")
			if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameWindowUpdate, Credit: 1 << 30}); err != nil {
				t.Fatal(err)
			}
		}
		var id uint64
		readUntil(t, c, func(f *kernel.Frame) bool { id = f.CallID; return f.Type == kernel.FrameRequest })
		if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: id, Credit: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		return receive(t, opened, 10*time.Second, "a stream never opened")
	}
	streams := []stream{open(), open()}

	called := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		called <- cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "waits"}, new(echopb.Echo))
	}()
	readUntil(t, c, func(f *kernel.Frame) bool { return f.Type == kernel.FrameRequest })
	start := time.Now()

	// The server reads no more. Each stream sends until a Send waits for
	// room: the first fills the ring to under 1 KiB, the second to less
	// than the smallest frame.
	for i, size := range []int{1 << 10, 0} {
		var sent atomic.Int64
		go func() {
			m := &echopb.Echo{Payload: make([]byte, size)}
			for streams[i].Send(m) == nil {
				sent.Add(1)
			}
		}()
		for last, still := int64(-1), 0; still < 10; {
			time.Sleep(10 * time.Millisecond)
			if n := sent.Load(); n != last {
				last, still = n, 0
			} else {
				still++
			}
		}
	}
	err := receive(t, called, 15*time.Second, "the call never ended")
	if waited := time.Since(start); kernel.CodeOf(err) != kernel.DeadlineExceeded || waited > 6*time.Second {
		t.Fatalf("the call returned %v after %s, want DeadlineExceeded at its 2s deadline, not after waiting wait_timeout's 10s for room for its Cancel", err, waited)
	}
}

// Over tcp-lv a request that finds the socket to a server that stopped
// reading full ends at the call's deadline too, not write_timeout later.
// Part of it is out by then, so it is not refused: the connection sends
// the rest on its own once the server reads again, and the server sees
// that request whole, then its Cancel, then the next call's request.
func TestARequestWaitingOnAFullSocketEndsAtTheCallsDeadline(t *testing.T) {
	// One connection: the next call must not go to a spare.
	cli, conns := rawServer(t, "tcp-lv", map[string]any{"write_timeout": "20s", "max_frame_size": "64MiB"}, func(cfg *kernrpc.Config) { cfg.Client.MaxPoolSize = 1 })
	// The server reads nothing yet: 32 MiB is more than the sockets hold.
	big := &echopb.Echo{Text: "big", Payload: make([]byte, 32<<20)}
	// Time to encode it under the race detector (over a second), and to
	// find the sockets full.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err := cli.Call(ctx, "Echo.Echo", big, new(echopb.Echo))
	if waited := time.Since(start); kernel.CodeOf(err) != kernel.DeadlineExceeded || waited > 10*time.Second {
		t.Fatalf("a request waiting on a full socket returned %v after %s, want DeadlineExceeded at its 3s deadline, not write_timeout's 20s", err, waited)
	}

	third := make(chan error, 1)
	var resp echopb.Echo
	go func() { third <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "after"}, &resp) }()
	c := receive(t, conns, 10*time.Second, "the client never connected")
	var seen []string
	var id uint64
	if !readUntil(t, c, func(f *kernel.Frame) bool {
		if f.Type != kernel.FrameRequest {
			seen = append(seen, f.Type.String())
			return false
		}
		var req echopb.Echo
		if err := proto.Unmarshal(f.Payload, &req); err != nil {
			t.Fatalf("a request of %d bytes arrived broken: %v", len(f.Payload), err)
		}
		seen = append(seen, req.Text)
		id = f.CallID
		return req.Text == "after"
	}) {
		t.Fatalf("the connection ended after %v, before the third call's request", seen)
	}
	if len(seen) < 2 || seen[0] != "big" || !slices.Contains(seen[1:len(seen)-1], kernel.FrameCancel.String()) {
		t.Fatalf("the server read %v; want the big request whole, its Cancel, then the third call's", seen)
	}
	answerAfter(t, c, id, third, &resp)
}

// answerAfter answers call id, the test's last, on c, the server's end
// of the connection, with "after", and wants that call, whose error comes
// on third and answer in resp, to get it.
func answerAfter(t *testing.T, c kernel.Conn, id uint64, third <-chan error, resp *echopb.Echo) {
	t.Helper()
	payload, _ := proto.Marshal(&echopb.Echo{Text: "after"})
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: id, Codec: "protobuf", Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, third, 10*time.Second, "the third call never ended"); err != nil || resp.Text != "after" {
		t.Fatalf("third call: %v (%q), want its answer", err, resp.Text)
	}
}
