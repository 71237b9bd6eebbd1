package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

type echoStream = kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]

// watchKinds are the stream kinds each lifecycle test runs for.
var watchKinds = []kernel.StreamKind{kernel.BidiStreaming, kernel.ServerStreaming, kernel.ClientStreaming}

// watcher serves Stream.Watch in each kind: its handler takes the stream's
// first message, says so on opened (and, but for client streaming, sends
// "open"), waits for its context to end and reports the context's error
// on saw.
type watcher struct {
	saw    chan error
	opened chan struct{}
}

func newWatcher() *watcher {
	return &watcher{saw: make(chan error, 1), opened: make(chan struct{}, 1)}
}

func watchMethod(kind kernel.StreamKind) string { return "Stream.Watch." + kind.String() }

func (w *watcher) register(srv *kernrpc.Server) {
	streamHandlers(srv)
	wait := func(ctx context.Context) error {
		w.opened <- struct{}{}
		<-ctx.Done()
		w.saw <- ctx.Err()
		return ctx.Err()
	}
	kernrpc.HandleBidiStream(srv, watchMethod(kernel.BidiStreaming), func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		if _, err := st.Recv(); err != nil {
			return err
		}
		if err := st.Send(&echopb.Echo{Text: "open"}); err != nil {
			return err
		}
		return wait(ctx)
	})
	kernrpc.HandleServerStream(srv, watchMethod(kernel.ServerStreaming), func(ctx context.Context, _ *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		if err := st.Send(&echopb.Echo{Text: "open"}); err != nil {
			return err
		}
		return wait(ctx)
	})
	kernrpc.HandleClientStream(srv, watchMethod(kernel.ClientStreaming), func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
		if _, err := st.Recv(); err != nil {
			return nil, err
		}
		return nil, wait(ctx)
	})
}

// open opens Stream.Watch of kind and returns once its handler waits.
func (w *watcher) open(t *testing.T, ctx context.Context, cli *kernrpc.Client, kind kernel.StreamKind) echoStream {
	t.Helper()
	var st echoStream
	var err error
	if kind == kernel.ServerStreaming {
		st, err = kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, watchMethod(kind), &echopb.Echo{})
	} else if st, err = kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, watchMethod(kind)); err == nil {
		err = st.Send(&echopb.Echo{Text: "first"})
	}
	if err != nil {
		t.Fatal(err)
	}
	if kind != kernel.ClientStreaming {
		if m, err := st.Recv(); err != nil || m.Text != "open" {
			t.Fatalf("first message: %v %v", m, err)
		}
	}
	receive(t, w.opened, 3*time.Second, "the handler did not get the stream's first message")
	return st
}

// forEachKind runs test for each transport and stream kind, with a
// server serving Stream.Watch and a client of it.
func forEachKind(t *testing.T, test func(t *testing.T, cfg *kernrpc.Config, srv *kernrpc.Server, cli *kernrpc.Client, w *watcher, kind kernel.StreamKind)) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		w := newWatcher()
		srv := startServer(t, cfg, w.register)
		cli := newClient(t, cfg)
		for _, kind := range watchKinds {
			t.Run(kind.String(), func(t *testing.T) { test(t, cfg, srv, cli, w, kind) })
		}
	})
}

func TestStreamCancelledByClient(t *testing.T) {
	forEachKind(t, func(t *testing.T, _ *kernrpc.Config, _ *kernrpc.Server, cli *kernrpc.Client, w *watcher, kind kernel.StreamKind) {
		ctx, cancel := context.WithCancel(context.Background())
		st := w.open(t, ctx, cli, kind)
		cancel()
		if _, err := st.Recv(); kernel.CodeOf(err) != kernel.Canceled {
			t.Fatalf("Recv after cancel = %v, want Canceled", err)
		}
		if err := st.Send(&echopb.Echo{}); kernel.CodeOf(err) != kernel.Canceled {
			t.Fatalf("Send after cancel = %v, want Canceled", err)
		}
		if err := receive(t, w.saw, 2*time.Second, "the handler's context did not end after the client cancelled"); !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v, want Canceled", err)
		}
	})
}

func TestStreamEndedByServer(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		startServer(t, cfg, func(srv *kernrpc.Server) {
			kernrpc.HandleBidiStream(srv, "Stream.Abort", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
				if _, err := st.Recv(); err != nil {
					return err
				}
				st.SetTrailer(kernel.Metadata{"why": "enough"})
				return kernel.Errorf(kernel.Aborted, "the server has had enough")
			})
		})
		cli := newClient(t, cfg)
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Stream.Abort")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&echopb.Echo{Text: "one"}); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		if kernel.CodeOf(err) != kernel.Aborted || !strings.Contains(err.Error(), "had enough") {
			t.Fatalf("Recv = %v, want the handler's Aborted", err)
		}
		if st.Trailer()["why"] != "enough" {
			t.Errorf("trailer = %v", st.Trailer())
		}
		// The stream is over: sending more fails with the same status.
		if err := st.Send(&echopb.Echo{}); kernel.CodeOf(err) != kernel.Aborted {
			t.Errorf("Send after the server ended = %v, want Aborted", err)
		}
	})
}

func TestStreamDeadlineMidStream(t *testing.T) {
	forEachKind(t, func(t *testing.T, _ *kernrpc.Config, _ *kernrpc.Server, cli *kernrpc.Client, w *watcher, kind kernel.StreamKind) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		st := w.open(t, ctx, cli, kind)
		start := time.Now()
		_, err := st.Recv()
		if kernel.CodeOf(err) != kernel.DeadlineExceeded {
			t.Fatalf("Recv past the deadline = %v, want DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited > 2*time.Second {
			t.Fatalf("Recv returned %v after the deadline", waited)
		}
		if err := receive(t, w.saw, 2*time.Second, "the handler's context did not end at the deadline"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("handler's context ended with %v, want DeadlineExceeded", err)
		}
	})
}

func TestStreamServerKilled(t *testing.T) {
	for _, tr := range streamTransports {
		for _, kind := range watchKinds {
			t.Run(tr+"/"+kind.String(), func(t *testing.T) {
				cmd, addr := startServerProcessTB(t, "KERNRPC_HELPER_TRANSPORT="+tr)
				cfg := testConfig(t)
				cfg.Transport.Name = tr
				if tr != "tcp-lv" {
					cfg.Transport.Options = nil
				}
				cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
				cli := newClient(t, cfg)
				var st echoStream
				var err error
				if kind == kernel.ServerStreaming {
					st, err = kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, watchMethod(kind), &echopb.Echo{})
				} else if st, err = kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, watchMethod(kind)); err == nil {
					err = st.Send(&echopb.Echo{Text: "first"})
				}
				if err != nil {
					t.Fatal(err)
				}
				if kind != kernel.ClientStreaming {
					if m, err := st.Recv(); err != nil || m.Text != "open" {
						t.Fatalf("first message: %v %v", m, err)
					}
				} else {
					time.Sleep(50 * time.Millisecond) // the server's process has no side channel to say it read
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				got := make(chan error, 1)
				go func() { _, err := st.Recv(); got <- err }()
				err = receive(t, got, 5*time.Second, "Recv still waiting after the server process was killed")
				if kernel.CodeOf(err) != kernel.Unavailable {
					t.Fatalf("Recv after the server died = %v, want Unavailable", err)
				}
			})
		}
	}
}

func TestStreamClientGone(t *testing.T) {
	forEachKind(t, func(t *testing.T, cfg *kernrpc.Config, _ *kernrpc.Server, _ *kernrpc.Client, w *watcher, kind kernel.StreamKind) {
		cli, err := kernrpc.NewClient(cfg, "echo")
		if err != nil {
			t.Fatal(err)
		}
		w.open(t, context.Background(), cli, kind)
		_ = cli.Close() // its connections go with it
		if err := receive(t, w.saw, 3*time.Second, "the handler's context did not end after its client went away"); err == nil {
			t.Fatal("handler's context ended without an error")
		}
	})
}

func TestThousandStreamsOnOneConnection(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		startServer(t, cfg, streamHandlers)
		cli := newClient(t, cfg) // pool_size 1: one connection
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		const streams, msgs = 1000, 10
		streamsOpen := make([]echoStream, streams)
		for i := range streamsOpen {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Echo")
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
			streamsOpen[i] = st
		}
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for i, st := range streamsOpen {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range msgs {
					text := strconv.Itoa(i) + "/" + strconv.Itoa(j)
					if err := st.Send(&echopb.Echo{Text: text}); err != nil {
						errs <- err
						return
					}
					m, err := st.Recv()
					if err != nil || m.Text != text {
						errs <- errors.Join(err, errors.New("stream "+strconv.Itoa(i)+" got "+m.GetText()+", want "+text))
						return
					}
				}
				if err := st.CloseSend(); err != nil {
					errs <- err
					return
				}
				if _, err := st.Recv(); !errors.Is(err, io.EOF) {
					errs <- errors.Join(err, errors.New("stream "+strconv.Itoa(i)+" did not end with OK"))
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	})
}

func TestShutdownWaitsForStreams(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		srv := startServer(t, cfg, streamHandlers)
		cli := newClient(t, cfg)
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Echo")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&echopb.Echo{Text: "before"}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		down := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			down <- srv.Shutdown(ctx)
		}()
		time.Sleep(100 * time.Millisecond)
		select {
		case err := <-down:
			t.Fatalf("Shutdown returned (%v) while a stream was open", err)
		default:
		}
		// The open stream is still served while the server drains.
		for i := range 5 {
			if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i)}); err != nil {
				t.Fatalf("send while draining: %v", err)
			}
			if m, err := st.Recv(); err != nil || m.Text != strconv.Itoa(i) {
				t.Fatalf("echo while draining: %v %v", m, err)
			}
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("stream ended with %v, want OK", err)
		}
		if err := receive(t, down, 3*time.Second, "Shutdown did not return once the last stream ended"); err != nil {
			t.Fatalf("Shutdown after every stream finished: %v", err)
		}
	})
}

func TestShutdownEndsStreamsAtItsDeadline(t *testing.T) {
	for _, kind := range watchKinds {
		t.Run(kind.String(), func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
				w := newWatcher()
				srv := startServer(t, cfg, w.register)
				cli := newClient(t, cfg)
				st := w.open(t, context.Background(), cli, kind)
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				err := srv.Shutdown(ctx)
				took := time.Since(start)
				if err == nil {
					t.Fatal("Shutdown reported no error though a stream outlived its timeout")
				}
				if took > time.Second {
					t.Fatalf("Shutdown with a 300ms context took %v", took)
				}
				_, err = st.Recv()
				if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), "shut down") {
					t.Fatalf("open stream ended with %v, want Unavailable saying the server shut down", err)
				}
				if err := receive(t, w.saw, 2*time.Second, "the handler's context was not cancelled"); err == nil {
					t.Fatal("handler's context ended without an error")
				}
			})
		})
	}
}

// A shutdown whose deadline ends a stream sends its final status from the
// shutdown's goroutine while the handler still runs: that status must not
// carry the trailers, which the handler may be setting as it goes (under
// -race the two met in the transport's encoding of the map; without it,
// they could crash the server).
func TestShutdownEndingAStreamLeavesItsTrailersToTheHandler(t *testing.T) {
	cfg := testConfig(t)
	started, stop, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		if err := s.RegisterStream("Trailers.Busy", kernel.ServerStreaming, func(ctx context.Context, st *kernrpc.ServerStream) error {
			defer close(finished)
			close(started)
			for i := 0; ; i++ { // busy, looking at neither ctx nor the stream
				st.SetTrailer(kernel.Metadata{"k" + strconv.Itoa(i%64): "v"})
				select {
				case <-stop:
					return nil
				default:
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
	})
	cli := newClient(t, cfg)
	cs, err := cli.NewStream(context.Background(), "Trailers.Busy")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); err == nil {
		t.Error("Shutdown reported no error though a stream outlived its deadline")
	}
	var m echopb.Echo
	if err := cs.RecvMsg(&m); kernel.CodeOf(err) != kernel.Unavailable {
		t.Errorf("the stream ended with %v; want Unavailable, the server shut down", err)
	}
	if md := cs.Trailer(); len(md) != 0 {
		t.Errorf("the shutdown's status carried trailers %v; the handler still owned them", md)
	}
	close(stop)
	<-finished
}

// A handler waiting in Recv when a shutdown ends its stream is told why:
// Unavailable, the server shut down; it is not left to guess from a
// cancelled context.
func TestShutdownTellsAWaitingHandlerWhy(t *testing.T) {
	cfg := testConfig(t)
	waited := make(chan error, 1)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.HandleBidiStream(s, "Stream.Listen", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			if _, err := st.Recv(); err != nil {
				return err
			}
			_, err := st.Recv() // the client sends no more
			waited <- err
			return err
		})
	})
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), newClient(t, cfg), "Stream.Listen")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); err == nil {
		t.Error("Shutdown reported no error though a stream outlived its timeout")
	}
	err = receive(t, waited, 5*time.Second, "the handler's Recv did not return after the shutdown ended its stream")
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), "the server shut down before the stream of Stream.Listen ended") {
		t.Errorf("the handler's Recv: %v; want Unavailable saying the server shut down", err)
	}
}

func TestStreamMethodMismatch(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx := context.Background()
	cases := []struct{ name, method, want string }{
		{"unknown method", "Nope.Nope", "not served"},
		{"unary method opened as a stream", "Echo.Echo", "unary method"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, tc.method)
			if err == nil {
				_, err = st.Recv()
			}
			if kernel.CodeOf(err) != kernel.Unimplemented || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want Unimplemented saying %q", err, tc.want)
			}
		})
	}
	t.Run("stream method called unary", func(t *testing.T) {
		err := cli.Call(ctx, "Count.Echo", &echopb.Echo{}, &echopb.Echo{})
		if kernel.CodeOf(err) != kernel.Unimplemented || !strings.Contains(err.Error(), "open a stream") {
			t.Fatalf("got %v, want Unimplemented saying to open a stream", err)
		}
	})
	t.Run("server stream without its request", func(t *testing.T) {
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up")
		if err != nil {
			t.Fatal(err)
		}
		_ = st.CloseSend()
		if _, err := st.Recv(); kernel.CodeOf(err) != kernel.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", err)
		}
	})
}

func TestStreamConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		set  func(*kernrpc.Config)
		key  string
	}{
		{"window too small", func(c *kernrpc.Config) { c.Streams.Window = 10 }, "streams.window"},
		{"connection window below window", func(c *kernrpc.Config) { c.Streams.Window, c.Streams.ConnectionWindow = 1<<20, 1<<10 }, "streams.connection_window"},
		{"window beyond credit", func(c *kernrpc.Config) { c.Streams.Window = 1 << 32 }, "streams.window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.set(cfg)
			if _, err := kernrpc.NewServer(cfg); err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("NewServer: %v, want an error naming %s", err, tc.key)
			}
			if _, err := kernrpc.NewClient(cfg, "echo"); err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("NewClient: %v, want an error naming %s", err, tc.key)
			}
		})
	}
}

// A stream read to its end lets go of its context: one that stayed
// registered with the context it was opened with would be held for as
// long as that lives (an application's root context: for ever), one per
// stream. With stream filters, the context ends once they returned.
func TestStreamReadToItsEndLetsGoOfItsContext(t *testing.T) {
	for _, filtered := range []bool{false, true} {
		t.Run("filtered="+strconv.FormatBool(filtered), func(t *testing.T) {
			cfg := testConfig(t)
			if filtered {
				cfg.Filters = []kernrpc.FilterConfig{{Name: "test-tap", Side: "client"}}
			}
			startServer(t, cfg, streamHandlers)
			cli := newClient(t, cfg)
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			freed := make(chan struct{})
			var streamCtx context.Context
			func() {
				// Reachable only through the stream's context, and that
				// only through parent unless the stream ended it.
				tag := new([64]byte)
				runtime.SetFinalizer(tag, func(*[64]byte) { close(freed) })
				ctx := context.WithValue(parent, streamTagKey{}, tag)
				st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3"})
				if err != nil {
					t.Fatal(err)
				}
				for {
					if _, err := st.Recv(); errors.Is(err, io.EOF) {
						break
					} else if err != nil {
						t.Fatal(err)
					}
				}
				streamCtx = st.Context()
				if h, err := st.Header(); err != nil || h["count"] != "3" {
					t.Errorf("Header after the end = %v, %v; want count=3", h, err)
				}
			}()
			select {
			case <-streamCtx.Done():
			case <-time.After(3 * time.Second):
				t.Fatal("the context of a stream read to its end did not end")
			}
			streamCtx = nil
			if !eventually(5*time.Second, func() bool {
				runtime.GC()
				select {
				case <-freed:
					return true
				default:
					return false
				}
			}) {
				t.Fatal("the context of a stream read to its end is still held by the one it was opened with")
			}
		})
	}
}

type streamTagKey struct{}

// CloseAndRecv on a stream whose connection was lost returns the loss,
// and frees the stream as a Recv that returned its end would: its
// filters return (and its context ends), though its CloseSend failed.
func TestCloseAndRecvOnALostConnectionFreesTheStream(t *testing.T) {
	addr := fakeServer(t, func(f *kernel.Frame) []*kernel.Frame {
		switch f.Type {
		case kernel.FrameRequest:
			return []*kernel.Frame{{Type: kernel.FrameWindowUpdate, Credit: 1 << 20}, {Type: kernel.FrameWindowUpdate, CallID: f.CallID, Credit: 1 << 20}}
		case kernel.FrameStreamData:
			return []*kernel.Frame{hangUp} // the first message: the connection is lost
		}
		return nil
	})
	cfg := testConfig(t)
	cfg.Transport.Options = nil // the fake server's tcp-lv takes pings 1s apart at most
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-tap", Side: "client"}}
	cli := newClient(t, cfg)
	clientTap, _ := kernrpc.FindPlugin[*tap](cli.Plugins(), "test-tap")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Join")
	if err != nil {
		t.Fatal(err)
	}
	// Sends until the client has seen the loss, so that CloseSend's
	// write fails.
	for st.Send(&echopb.Echo{Text: "one"}) == nil {
		if ctx.Err() != nil {
			t.Fatal("the stream's sends still succeed after its connection was lost")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := st.CloseAndRecv(); kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("CloseAndRecv = %v, want Unavailable", err)
	}
	if ended := clientTap.waitEnded(t, 1)[0]; kernel.CodeOf(ended.err) != kernel.Unavailable {
		t.Errorf("the client filter saw the stream end with %v, want Unavailable", ended.err)
	}
}

// A client-streaming server may answer, and end the stream with OK,
// before the client closed its side. If the connection is lost after
// that, CloseAndRecv still returns the answer the client holds: there is
// nothing left to half-close, so the failed write of CloseSend is no
// outcome of the call.
func TestCloseAndRecvAfterTheServerAnsweredSurvivesALostConnection(t *testing.T) {
	answer := mustMarshal(t, &echopb.Echo{Text: "answer"})
	methods := map[uint64]string{}
	addr := fakeServer(t, func(f *kernel.Frame) []*kernel.Frame {
		switch f.Type {
		case kernel.FrameRequest:
			methods[f.CallID] = f.Method
			return []*kernel.Frame{{Type: kernel.FrameWindowUpdate, Credit: 1 << 20}, {Type: kernel.FrameWindowUpdate, CallID: f.CallID, Credit: 1 << 20}}
		case kernel.FrameStreamData:
			if methods[f.CallID] == "Fake.Lose" {
				return []*kernel.Frame{hangUp}
			}
			if f.Flags&kernel.FlagEndStream != 0 {
				return nil
			}
			// The answer, and the end with OK, at the first message.
			return []*kernel.Frame{
				{Type: kernel.FrameStreamData, CallID: f.CallID, Payload: answer},
				{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: f.CallID, Metadata: kernel.Metadata{"done": "yes"}},
			}
		}
		return nil
	})
	cfg := testConfig(t)
	cfg.Transport.Options = nil // the fake server's tcp-lv takes pings 1s apart at most
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Fake.Answer")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&echopb.Echo{Text: "one"}); err != nil {
		t.Fatal(err)
	}
	// The server's end is in once its trailers are.
	for st.Trailer() == nil {
		if ctx.Err() != nil {
			t.Fatal("the server's end never came")
		}
		time.Sleep(time.Millisecond)
	}
	// Another stream on the connection loses it.
	lose, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Fake.Lose")
	if err != nil {
		t.Fatal(err)
	}
	for lose.Send(&echopb.Echo{Text: "one"}) == nil {
		if ctx.Err() != nil {
			t.Fatal("the stream's sends still succeed after its connection was lost")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := lose.Recv(); kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("the stream that lost the connection: %v, want Unavailable", err)
	}
	resp, err := st.CloseAndRecv()
	if err != nil || resp.GetText() != "answer" {
		t.Fatalf("CloseAndRecv after the server answered with OK, then the connection was lost: %v, %v; want the answer", resp, err)
	}
}
