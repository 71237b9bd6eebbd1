package kernrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// rawShmRing is an shm-ring transport for a test's side that speaks
// frames itself: one that stops reading when the test says so.
func rawShmRing(t *testing.T, opts map[string]any) kernel.Transport {
	t.Helper()
	return rawTransport(t, "shm-ring", opts)
}

func rawTransport(t *testing.T, name string, opts map[string]any) kernel.Transport {
	t.Helper()
	tr, err := kernel.NewTransport(name, opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// rawShmServer listens on shm-ring with opts for a test that speaks
// frames itself, and returns a client of it and the connections it
// accepts.
func rawShmServer(t *testing.T, opts map[string]any) (*kernrpc.Client, <-chan kernel.Conn) {
	t.Helper()
	return rawServer(t, "shm-ring", opts)
}

// rawServer is rawShmServer over the transport name; tune, if given,
// changes the client's config.
func rawServer(t *testing.T, name string, opts map[string]any, tune ...func(*kernrpc.Config)) (*kernrpc.Client, <-chan kernel.Conn) {
	t.Helper()
	addr := fixedAddress(t, name)
	l, err := rawTransport(t, name, opts).Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns := make(chan kernel.Conn, 4)
	go func() {
		for {
			c, err := l.Accept(context.Background())
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			conns <- c
		}
	}()
	_, clientCfg := lonePair(t, &kernrpc.Config{Transport: kernrpc.PluginConfig{Name: name, Options: opts}}, addr)
	for _, f := range tune {
		f(clientCfg)
	}
	return newClient(t, clientCfg), conns
}

// readUntil reads c's frames, releasing them, until stop says one is what
// it waited for (true) or the connection ends (false).
func readUntil(t *testing.T, c kernel.Conn, stop func(f *kernel.Frame) bool) bool {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		f, err := c.ReadFrame(ctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil && c.Err() == nil {
				t.Fatalf("nothing more came on a connection that stays open: %v", err)
			}
			return false
		}
		done := stop(f)
		f.Release()
		if done {
			return true
		}
	}
}

// A request over max_concurrent_calls is answered at once, unprocessed.
// On shm-ring that answer, written by the server's reader, may find no
// room in a ring its client has not read for wait_timeout, and is refused
// alone: the connection lives on, and the call it answered, on a client
// that reads again, must not wait for an answer that will never come. The
// server closes the connection instead, as for a refused answer of a call
// it served (closeUnanswered). Here a client of the transport alone lets
// a stream fill the server's ring to it, then sends a call over the
// limit, then cancels the stream: once the handler sees the Cancel, which
// the reader takes after the call, the refusal is behind it, and the
// client reads again.
func TestARefusalOfACallOverTheLimitThatFindsNoRoomClosesTheConnection(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	opts := map[string]any{"ring_size": "16KiB", "wait_timeout": "100ms"}
	cfg := testConfig(t)
	cfg.Transport.Name = "shm-ring"
	cfg.Transport.Options = opts
	cfg.Server.MaxConcurrentCalls = 1
	flooded, cancelled, reading := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.HandleBidiStream(srv, "Flood.Hold", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			// Until the ring has no room for even an empty message.
			for _, size := range []int{1 << 10, 0} {
				m := &echopb.Echo{Payload: make([]byte, size)}
				for st.Send(m) == nil {
				}
			}
			close(flooded)
			<-ctx.Done()
			close(cancelled)
			select {
			case <-reading:
			case <-time.After(10 * time.Second):
			}
			return ctx.Err()
		})
	})
	c, err := rawShmRing(t, opts).Dial(context.Background(), srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	write := func(f *kernel.Frame) {
		t.Helper()
		if err := c.WriteFrame(f); err != nil {
			t.Fatalf("write %v: %v", f.Type, err)
		}
	}
	write(&kernel.Frame{Type: kernel.FrameWindowUpdate, Credit: 1 << 20})
	write(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: 1, Method: "Flood.Hold", Codec: "protobuf", Credit: 1 << 20})
	receive(t, flooded, 10*time.Second, "Flood.Hold never filled the ring")
	// The stream is the connection's one call: this one is refused.
	write(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2, Method: "Echo.Echo", Codec: "protobuf"})
	write(&kernel.Frame{Type: kernel.FrameCancel, CallID: 1})
	receive(t, cancelled, 10*time.Second, "the server never read the Cancel behind the call over the limit")
	close(reading)

	// In ring order: the refusal of call 2, if it went, came before the
	// stream's end.
	answered := false
	ended := readUntil(t, c, func(f *kernel.Frame) bool {
		if f.Type == kernel.FrameResponse && f.CallID == 2 {
			answered = true
		}
		return f.Type == kernel.FrameResponse && f.CallID == 1
	})
	if ended && !answered {
		t.Fatalf("the server ended the stream and kept the connection open, but never answered the call over max_concurrent_calls: its client waits for that answer for good")
	}
	if !answered && !strings.Contains(logs.String(), "refusal of a call not sent") {
		t.Fatalf("the connection ended without the refusal of call 2, and the server logged no reason:\n%s", logs)
	}
}

// A Cancel tells the server to stop a call or stream the caller gave up
// (docs/protocol.md). On shm-ring it may find no room in a ring the
// server has not read for wait_timeout, and be refused alone: the server
// would then run the handler on, a stream's for good (it waits for
// messages or credit that will not come), holding one of its
// max_concurrent_calls. The client closes the connection instead, which
// the server takes as the end of every call on it. Here the test is the
// server, speaking frames itself: it grants a stream credit, reads
// nothing while the client fills the ring with messages and then closes
// the stream, and reads again once the stream is closed. Either a Cancel
// for the stream comes, or the connection ends; a stream opened next must
// not come first.
func TestACancelTheTransportRefusesClosesTheConnection(t *testing.T) {
	fs := newFloodedStream(t, "Flood.In")
	logs, c, cli, ctx, st := fs.logs, fs.c, fs.cli, fs.ctx, fs.st
	st.Close() // its Cancel finds no room either
	// Close may leave the Cancel to the stream's own goroutine: wait for
	// its refusal (the client logs it), so that the reads below cannot
	// make room for it first. Without the fix nothing is logged, and the
	// wait ends at its bound.
	for end := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "cancel not sent") && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}

	// The client carries on: a stream opened now goes where the client
	// sees fit (this connection, if it lives on).
	go func() {
		if next, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.In"); err == nil {
			next.Close()
		}
	}()
	var cancelled, next bool
	readUntil(t, c, func(f *kernel.Frame) bool {
		switch {
		case f.Type == kernel.FrameCancel && f.CallID == 1:
			cancelled = true
		case f.Type == kernel.FrameRequest:
			next = true
		}
		return cancelled || next
	})
	if next && !cancelled {
		t.Fatalf("the client gave up the stream and went on using the connection, but its Cancel never came: the server's handler runs on")
	}
	if !cancelled && !strings.Contains(logs.String(), "cancel not sent") {
		t.Fatalf("the connection ended without the Cancel, and the client logged no reason:\n%s", logs)
	}
}

// CloseSend tells the server that no more messages come; a server's
// handler reading to the end waits for it. On shm-ring its half-close may
// find no room in a ring the server has not read for wait_timeout, and be
// refused alone: nothing sends it again (a second CloseSend returns nil,
// sending nothing), so the handler would wait for it, and the client's
// Recv for the handler's answer, until the stream's context ends. The
// stream ends instead with that status, telling the server (or, that
// Cancel refused too, closing the connection). As for the Cancel above,
// the test is the server: the half-close, a Cancel, or the connection's
// end must come before a stream opened next.
func TestAHalfCloseTheTransportRefusesEndsTheStream(t *testing.T) {
	fs := newFloodedStream(t, "Sink.Count")
	logs, c, cli, ctx, st := fs.logs, fs.c, fs.cli, fs.ctx, fs.st
	if err := st.CloseSend(); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("CloseSend on a full ring: %v, want ResourceExhausted", err)
	}

	go func() {
		if next, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Sink.Count"); err == nil {
			next.Close()
		}
	}()
	var told, next bool
	readUntil(t, c, func(f *kernel.Frame) bool {
		switch {
		case f.CallID == 1 && (f.Type == kernel.FrameCancel || f.Type == kernel.FrameStreamData && f.Flags&kernel.FlagEndStream != 0):
			told = true
		case f.Type == kernel.FrameRequest:
			next = true
		}
		return told || next
	})
	if next && !told {
		t.Fatalf("CloseSend failed and the client went on using the connection, but neither the half-close nor a Cancel came: the server's handler waits for the end of the stream for good")
	}
	if !told && !strings.Contains(logs.String(), "cancel not sent") {
		t.Fatalf("the connection ended without the half-close or a Cancel, and the client logged no reason:\n%s", logs)
	}
	// Nor does the client's side wait for an answer that cannot come.
	done := make(chan error, 1)
	go func() { _, err := st.Recv(); done <- err }()
	if err := receive(t, done, 10*time.Second, "Recv after a refused CloseSend never returned"); err == nil {
		t.Fatal("Recv after a refused CloseSend returned a message")
	}
}

// floodedStream is a client on shm-ring whose server is the test itself,
// speaking frames over c: the client opened a stream (call id 1), was
// granted credit, and sent messages until the ring to c had no room for
// even an empty one. c reads nothing until the test does.
type floodedStream struct {
	logs *enginetest.LogBuffer
	c    kernel.Conn
	cli  *kernrpc.Client
	ctx  context.Context
	st   kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]
}

func newFloodedStream(t *testing.T, method string) *floodedStream {
	t.Helper()
	fs := &floodedStream{logs: enginetest.DefaultLog(t)}
	var conns <-chan kernel.Conn
	fs.cli, conns = rawShmServer(t, map[string]any{"ring_size": "16KiB", "wait_timeout": "100ms"})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fs.ctx = ctx

	opened := make(chan error, 1)
	go func() {
		var err error
		fs.st, err = kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, fs.cli, method)
		opened <- err
	}()
	fs.c = receive(t, conns, 10*time.Second, "the client never connected")
	if !readUntil(t, fs.c, func(f *kernel.Frame) bool { return f.Type == kernel.FrameRequest && f.CallID == 1 }) {
		t.Fatal("the connection ended before the stream's request")
	}
	if err := receive(t, opened, 10*time.Second, "the stream never opened"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*kernel.Frame{{Type: kernel.FrameWindowUpdate, Credit: 1 << 30}, {Type: kernel.FrameWindowUpdate, CallID: 1, Credit: 1 << 30}} {
		if err := fs.c.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	// Until the ring has no room for even an empty message; the credit
	// comes in on the client's stream reader meanwhile.
	for _, size := range []int{1 << 10, 0} {
		m := &echopb.Echo{Payload: make([]byte, size)}
		for {
			err := fs.st.Send(m)
			if err == nil {
				continue
			}
			if kernel.CodeOf(err) != kernel.ResourceExhausted {
				t.Fatalf("send: %v, want ResourceExhausted once the ring is full", err)
			}
			break
		}
	}
	return fs
}
