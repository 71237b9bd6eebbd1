package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// tap is a filter with a stream form: it counts the messages of every
// stream it sees, adds request metadata on the client, refuses streams of
// Count.Refused, and records how each stream ended.
type tap struct {
	mu    sync.Mutex
	ended []tapped
	unary int
}

type tapped struct {
	method     string
	side       kernel.Side
	sent, recv int
	err        error
	trailer    kernel.Metadata
	metadata   kernel.Metadata
}

func (tp *tap) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	tp.mu.Lock()
	tp.unary++
	tp.mu.Unlock()
	return next(ctx, info, req)
}

type tapKey struct{}

func (tp *tap) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if info.Method == "Count.Refused" {
		return kernel.Errorf(kernel.PermissionDenied, "tap refuses %s", info.Method)
	}
	if info.Side == kernel.ClientSide {
		info.SetRequestMetadata("tapped", "yes")
	}
	w := &countingStream{Stream: st}
	err := next(context.WithValue(ctx, tapKey{}, "tap was here"), info, w)
	tp.mu.Lock()
	tp.ended = append(tp.ended, tapped{info.Method, info.Side, w.sent, w.recv, err, info.ResponseMetadata, info.Metadata})
	tp.mu.Unlock()
	return err
}

type countingStream struct {
	kernel.Stream
	sent, recv int
}

func (c *countingStream) SendMsg(m any) error {
	err := c.Stream.SendMsg(m)
	if err == nil {
		c.sent++
	}
	return err
}

func (c *countingStream) RecvMsg(m any) error {
	err := c.Stream.RecvMsg(m)
	if err == nil {
		c.recv++
	}
	return err
}

func (tp *tap) waitEnded(t *testing.T, n int) []tapped {
	t.Helper()
	var got []tapped
	if !eventually(3*time.Second, func() bool {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		got = append([]tapped(nil), tp.ended...)
		return len(got) >= n
	}) {
		t.Fatalf("fewer than %d streams ended through the filter", n)
	}
	return got
}

var _ kernel.StreamFilter = (*tap)(nil)

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-tap", New: func(any) (kernel.Filter, error) { return &tap{}, nil }})
}

func TestStreamFiltersSeeEveryStream(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-tap"}, {Name: "retry", Side: "client"}}
	srv := startServer(t, cfg, func(srv *kernrpc.Server) {
		streamHandlers(srv)
		kernrpc.HandleServerStream(srv, "Count.Context", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			v, _ := ctx.Value(tapKey{}).(string)
			md := kernrpc.IncomingMetadata(st.Context())
			return st.Send(&echopb.Echo{Text: v + "/" + md["tapped"]})
		})
		kernrpc.HandleBidiStream(srv, "Count.Refused", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			return nil
		})
	})
	cli := newClient(t, cfg)
	ctx := context.Background()
	serverTap, _ := kernrpc.FindPlugin[*tap](srv.Plugins(), "test-tap")
	clientTap, _ := kernrpc.FindPlugin[*tap](cli.Plugins(), "test-tap")

	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "7"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := st.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	client := clientTap.waitEnded(t, 1)[0]
	server := serverTap.waitEnded(t, 1)[0]
	if client.sent != 1 || client.recv != 7 || client.err != nil || client.trailer["sent"] != "7" {
		t.Errorf("client filter saw %+v; want 1 sent, 7 received, OK, trailer sent=7", client)
	}
	if server.sent != 7 || server.recv != 1 || server.err != nil || server.metadata["tapped"] != "yes" {
		t.Errorf("server filter saw %+v; want 7 sent, 1 received, OK, the client filter's metadata", server)
	}

	t.Run("context and metadata reach the handler", func(t *testing.T) {
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Context", &echopb.Echo{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil || m.Text != "tap was here/yes" {
			t.Fatalf("handler saw %q, %v; want the filter's context value and metadata", m.GetText(), err)
		}
		_, _ = st.Recv()
	})
	t.Run("a filter refuses a stream", func(t *testing.T) {
		_, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Refused")
		if kernel.CodeOf(err) != kernel.PermissionDenied {
			t.Fatalf("OpenStream = %v, want the client filter's PermissionDenied", err)
		}
	})
	t.Run("the final status reaches the filters", func(t *testing.T) {
		before := len(clientTap.waitEnded(t, 2))
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "nan"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); kernel.CodeOf(err) != kernel.InvalidArgument {
			t.Fatalf("Recv = %v", err)
		}
		got := clientTap.waitEnded(t, before+1)[before]
		if kernel.CodeOf(got.err) != kernel.InvalidArgument {
			t.Fatalf("client filter's next returned %v, want the server's InvalidArgument", got.err)
		}
	})
	t.Run("unary-only filters stay out of streams", func(t *testing.T) {
		// retry has no stream form; a stream still works beside it, and
		// unary calls still go through the tap's Invoke.
		if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: strconv.Itoa(1)}, &echopb.Echo{}); err != nil {
			t.Fatal(err)
		}
		clientTap.mu.Lock()
		defer clientTap.mu.Unlock()
		if clientTap.unary != 1 {
			t.Fatalf("tap's Invoke saw %d unary calls, want 1", clientTap.unary)
		}
	})
}

// The engine reports the streams open on each side, for the console and
// the metrics exporters.
func TestEngineReportsOpenStreams(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer"}}
	srv := startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	serverObs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	clientObs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")
	waitReading := func(o *observer, name string, want float64) {
		t.Helper()
		eventually(3*time.Second, func() bool { return o.readings(t)[name].Value == want })
		if got := o.readings(t)[name]; got.Value != want || got.Help == "" {
			t.Fatalf("%s = %+v, want %v", name, got, want)
		}
	}
	streams := make([]echoStream, 3)
	for i := range streams {
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Echo")
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	waitReading(clientObs, "client_streams_open", 3)
	waitReading(serverObs, "server_streams_open", 3)
	for _, st := range streams {
		_ = st.CloseSend()
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	waitReading(clientObs, "client_streams_open", 0)
	waitReading(serverObs, "server_streams_open", 0)
	waitReading(serverObs, "server_streams_total", 3)
}

// swallower is a broken stream filter: it returns nil without calling next.
type swallower struct{}

func (swallower) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (swallower) InvokeStream(context.Context, *kernel.CallInfo, kernel.Stream, kernel.StreamInvoker) error {
	return nil
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-swallower", New: func(any) (kernel.Filter, error) { return swallower{}, nil }})
}

// A server stream filter that neither runs the handler nor refuses must
// not pass for a stream that ended OK.
func TestServerStreamFilterThatSkipsTheHandler(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-swallower", Side: "server"}}
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	// The end may come before the request is sent, or after.
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: "3"})
	if err == nil {
		_, err = st.Recv()
	}
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "without running the handler") {
		t.Fatalf("Recv = %v, want Internal naming the filter's mistake", err)
	}
}

// ctxFilter is a client stream filter that passes on a context of its
// own, derived from the stream's: with a timeout, or cancelled by it.
type ctxFilter struct{ cancels bool }

func (ctxFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f ctxFilter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	var cancel context.CancelFunc
	if f.cancels {
		ctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(50*time.Millisecond, cancel)
	} else {
		ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	}
	defer cancel()
	return next(ctx, info, st)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-ctx-timeout", New: func(any) (kernel.Filter, error) { return ctxFilter{}, nil }})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-ctx-cancel", New: func(any) (kernel.Filter, error) { return ctxFilter{cancels: true}, nil }})
}

// A client stream filter's own context bounds the stream: when it ends,
// the stream ends with what ended it (its deadline, or its cancel), the
// same for RecvMsg and SendMsg, not with how the caller's context stands.
func TestStreamEndsWithTheStatusOfTheFiltersContext(t *testing.T) {
	for _, tc := range []struct {
		filter string
		code   kernel.Code
		says   string
	}{
		{"test-ctx-timeout", kernel.DeadlineExceeded, "deadline"},
		{"test-ctx-cancel", kernel.Canceled, "cancel"},
	} {
		t.Run(tc.filter, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Filters = []kernrpc.FilterConfig{{Name: tc.filter, Side: "client"}}
			startServer(t, cfg, streamHandlers)
			cli := newClient(t, cfg)
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Wait")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			_, err = st.Recv()
			if kernel.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Recv = %v, want %v saying %q", err, tc.code, tc.says)
			}
			if err := st.Send(&echopb.Echo{}); kernel.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Send after the end = %v, want %v saying %q", err, tc.code, tc.says)
			}
		})
	}
}
