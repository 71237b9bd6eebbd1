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

// misbehavingStreams registers stream handlers that break the rules a
// typed client relies on, or panic.
func misbehavingStreams(srv *kernrpc.Server) {
	kernrpc.HandleBidiStream(srv, "Bad.Panic", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		if _, err := st.Recv(); err != nil {
			return err
		}
		panic("stream handler bug")
	})
	// Registered as client-streaming without the typed helper: the raw
	// handler may answer twice, or not at all.
	mustRegisterStream(srv, "Bad.TwoAnswers", kernel.ClientStreaming, func(ctx context.Context, st *kernrpc.ServerStream) error {
		for range 2 {
			if err := st.SendMsg(&echopb.Echo{Text: "answer"}); err != nil {
				return err
			}
		}
		return nil
	})
	mustRegisterStream(srv, "Bad.NoAnswer", kernel.ClientStreaming, func(ctx context.Context, st *kernrpc.ServerStream) error { return nil })
	kernrpc.HandleClientStream(srv, "Bad.NilAnswer", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
		return nil, nil
	})
}

func mustRegisterStream(srv *kernrpc.Server, method string, kind kernel.StreamKind, h func(context.Context, *kernrpc.ServerStream) error) {
	if err := srv.RegisterStream(method, kind, h); err != nil {
		panic(err)
	}
}

// A stream handler that panics ends its stream with Internal, logged at
// ERROR with the stack; the server serves on.
func TestStreamHandlerPanicIsInternal(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	startServer(t, cfg, misbehavingStreams)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Bad.Panic")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "handler for stream Bad.Panic panicked: stream handler bug") {
		t.Errorf("Recv from a stream whose handler panicked: %v; want Internal naming the panic", err)
	}
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "still"}, &echopb.Echo{}); err != nil {
		t.Errorf("a call after a stream handler panicked: %v", err)
	}
	for _, want := range []string{`level=ERROR msg="stream handler panicked"`, "method=Bad.Panic", "stream_misuse_test.go"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the panic's log lacks %q:\n%s", want, logs.String())
		}
	}
}

// CloseAndRecv holds a client-streaming server to one answer: more than
// one, or none with OK, is Internal naming the method; so is a typed
// handler returning neither a response nor an error.
func TestClientStreamWantsExactlyOneAnswer(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, misbehavingStreams)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for method, want := range map[string]string{
		"Bad.TwoAnswers": "the server sent more than one response to the client-streaming call of Bad.TwoAnswers",
		"Bad.NoAnswer":   "the server ended the client-streaming call of Bad.NoAnswer with OK but no response",
		"Bad.NilAnswer":  "the handler of Bad.NilAnswer returned neither a response nor an error",
	} {
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, method)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := st.CloseAndRecv()
		if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), want) {
			t.Errorf("CloseAndRecv of %s: %v, %v; want Internal: %s", method, resp, err, want)
		}
	}
}

// A second CloseAndRecv says it is one, rather than blaming the server for
// an end without a response: the first took the response.
func TestCloseAndRecvTwice(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Join")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{Text: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	resp, err := st.CloseAndRecv()
	if kernel.CodeOf(err) != kernel.FailedPrecondition || !strings.Contains(err.Error(), "CloseAndRecv called twice on the client-streaming call of Count.Join") {
		t.Errorf("a second CloseAndRecv: %v, %v; want FailedPrecondition saying it was called twice", resp, err)
	}
}

// A Send after CloseSend, on a stream the server holds open, is refused
// on the client; RegisterStream refuses a kind that is not one.
func TestStreamMisuse(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Count.Wait holds the stream open until its context ends: the stream
	// cannot have ended by the time Send is called, which would make Send
	// return io.EOF instead.
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Wait")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if m, err := st.Recv(); err != nil || m.Text != "waiting" {
		t.Fatalf("Count.Wait's first message: %v, %v", m, err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{}); kernel.CodeOf(err) != kernel.FailedPrecondition || !strings.Contains(err.Error(), "SendMsg after CloseSend") {
		t.Errorf("Send after CloseSend: %v; want FailedPrecondition", err)
	}
	fresh, err := kernrpc.NewServer(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Shutdown(ctx)
	if err := fresh.RegisterStream("Bad.Kind", kernel.StreamKind(9), func(context.Context, *kernrpc.ServerStream) error { return nil }); err == nil || !strings.Contains(err.Error(), `RegisterStream "Bad.Kind": unknown stream kind 9`) {
		t.Errorf("RegisterStream with kind 9: %v", err)
	}
}

// docs/reliability.md: "stream data no stream asked for" is a protocol
// error: the connection is closed. A client sending StreamData on a
// connection where no stream was ever opened was kept, and got a
// WindowUpdate on call id 0 the server had never announced, which the
// client would take for the window.
func TestStreamDataBeforeAnyStreamClosesTheConnection(t *testing.T) {
	srv := startServer(t, testConfig(t), nil)
	conn := dialRaw(t, srv.Addr())
	for range 160 {
		if err := conn.WriteFrame(&kernel.Frame{Type: kernel.FrameStreamData, CallID: 7, Payload: make([]byte, 64<<10)}); err != nil {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for {
		f, err := conn.ReadFrame(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("the server kept a connection whose client sent stream data no stream asked for")
			}
			return // closed, as documented
		}
		if f.Type == kernel.FrameWindowUpdate {
			t.Errorf("the server granted credit (call %d, %d bytes) for stream data no stream asked for", f.CallID, f.Credit)
		}
		f.Release()
	}
}
