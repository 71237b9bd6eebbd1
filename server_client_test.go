package kernrpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
	_ "github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	_ "github.com/kernrpc/kernrpc/plugins/registry/memory"
	"github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// testConfig gives each test its own registry namespace, so tests running
// one after another never see each other's servers.
func testConfig(t testing.TB) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": t.Name()}
	cfg.Transport.Options = map[string]any{"keepalive_interval": "100ms", "keepalive_timeout": "200ms"}
	return cfg
}

func echo(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil }

// startServer starts a server with the echo handler plus extra handlers.
func startServer(t testing.TB, cfg *kernrpc.Config, extra func(*kernrpc.Server)) *kernrpc.Server {
	t.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Echo", echo)
	if extra != nil {
		extra(srv)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}

// receive waits up to d for a value from ch; what says what did not
// happen in time.
func receive[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s (waited %v)", what, d)
		panic("unreachable")
	}
}

func newClient(t testing.TB, cfg *kernrpc.Config) *kernrpc.Client {
	t.Helper()
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func TestCallModels(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	ctx := context.Background()

	var resp echopb.Echo
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "sync"}, &resp); err != nil || resp.Text != "sync" {
		t.Fatalf("Call: %v, %q", err, resp.Text)
	}

	var goResp echopb.Echo
	call := cli.Go(ctx, "Echo.Echo", &echopb.Echo{Text: "async"}, &goResp, nil)
	done := receive(t, call.Done, 5*time.Second, "Go: no answer")
	if done.Err != nil || goResp.Text != "async" {
		t.Fatalf("Go: %v, %q", done.Err, goResp.Text)
	}

	got := make(chan string, 1)
	var cbResp echopb.Echo
	cli.CallFunc(ctx, "Echo.Echo", &echopb.Echo{Text: "callback"}, &cbResp, func(c *kernrpc.Call) {
		if c.Err != nil {
			got <- "error: " + c.Err.Error()
			return
		}
		got <- c.Response.(*echopb.Echo).Text
	})
	s := receive(t, got, 5*time.Second, "CallFunc: callback not run")
	if s != "callback" {
		t.Fatalf("CallFunc: got %q", s)
	}
}

func TestManyConcurrentCallersOverOneConnectionGetTheirOwnAnswers(t *testing.T) {
	cfg := testConfig(t)
	var slowest atomic.Int64
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Jitter", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			// Answer out of order, so matching by call id is really tested.
			d := time.Duration(len(req.Payload)%7) * 100 * time.Microsecond
			slowest.Store(max(slowest.Load(), int64(d)))
			time.Sleep(d)
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	const callers, perCaller = 64, 50
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range perCaller {
				want := fmt.Sprintf("caller %d call %d", g, i)
				req := &echopb.Echo{Text: want, Payload: bytes.Repeat([]byte{byte(g)}, g+i)}
				var resp echopb.Echo
				if err := cli.Call(context.Background(), "Echo.Jitter", req, &resp); err != nil {
					errs <- err
					return
				}
				if resp.Text != want || !bytes.Equal(resp.Payload, req.Payload) {
					errs <- fmt.Errorf("caller %d got %q, want %q", g, resp.Text, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClientDeadlineCancelsServerHandlerContext(t *testing.T) {
	cfg := testConfig(t)
	handlerErr := make(chan error, 1)
	var sawDeadline atomic.Bool
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Block", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			_, ok := ctx.Deadline()
			sawDeadline.Store(ok)
			select {
			case <-ctx.Done():
				handlerErr <- ctx.Err()
				return nil, ctx.Err()
			case <-time.After(10 * time.Second):
				handlerErr <- errors.New("handler context never cancelled")
				return req, nil
			}
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := cli.Call(ctx, "Echo.Block", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.DeadlineExceeded {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("call returned after %v; the deadline was 150ms", el)
	}
	herr := receive(t, handlerErr, 3*time.Second, "server handler's context was not cancelled")
	if !errors.Is(herr, context.DeadlineExceeded) && !errors.Is(herr, context.Canceled) {
		t.Fatalf("handler ctx err = %v", herr)
	}
	if !sawDeadline.Load() {
		t.Error("handler's context had no deadline; the client's deadline did not travel")
	}
	// The connection survives: the late or missing answer does not poison it.
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "after"}, &resp); err != nil || resp.Text != "after" {
		t.Fatalf("call after a timed-out call: %v %q", err, resp.Text)
	}
}

func TestClientCancellationReachesServer(t *testing.T) {
	cfg := testConfig(t)
	handlerErr := make(chan error, 1)
	started := make(chan struct{})
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Block", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			close(started)
			<-ctx.Done()
			handlerErr <- ctx.Err()
			return nil, ctx.Err()
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if err := cli.Call(ctx, "Echo.Block", &echopb.Echo{}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.Canceled {
		t.Fatalf("err = %v, want Canceled", err)
	}
	herr := receive(t, handlerErr, 3*time.Second, "cancellation did not reach the handler")
	if !errors.Is(herr, context.Canceled) {
		t.Fatalf("handler ctx err = %v, want Canceled", herr)
	}
}

// A lone request is served on the goroutine that read it; a handler that
// then blocks must not keep the connection unread for other calls.
func TestBlockedHandlerDoesNotStallOtherCallsOnItsConnection(t *testing.T) {
	cfg := testConfig(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			close(entered)
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg) // pool_size 1: both calls share one connection
	held := make(chan error, 1)
	go func() { held <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}) }()
	<-entered
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var resp echopb.Echo
		err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "past"}, &resp)
		cancel()
		if err != nil || resp.Text != "past" {
			t.Fatalf("call %d while another handler blocks: %v", i, err)
		}
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("held call: %v", err)
	}
}

// Requests that arrive together are served one after another on the
// reading goroutine while that is cheap; a slow method must not be
// serialised that way: its calls from one connection run in parallel.
func TestSlowHandlersOnOneConnectionRunInParallel(t *testing.T) {
	cfg := testConfig(t)
	var running, most atomic.Int32
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Slow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			running.Add(-1)
			return req, nil
		})
	})
	cli := newClient(t, cfg) // one connection
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				if err := cli.Call(context.Background(), "Echo.Slow", &echopb.Echo{}, &echopb.Echo{}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m < 4 {
		t.Fatalf("at most %d of 8 concurrent calls to a slow method ran at once; they were serialised", m)
	}
}

func TestMetadataTravelsBothWays(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.MD", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			in := kernrpc.IncomingMetadata(ctx)
			kernrpc.CallInfoFrom(ctx).SetResponseMetadata("seen", in["tenant"])
			return &echopb.Echo{Text: in["request-id"]}, nil
		})
	})
	cli := newClient(t, cfg)
	ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"tenant": "acme", "request-id": "r-42"})
	var resp echopb.Echo
	md, err := cli.CallWithMetadata(ctx, "Echo.MD", &echopb.Echo{}, &resp)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text != "r-42" || md["seen"] != "acme" {
		t.Fatalf("request metadata seen as %q, response metadata %v", resp.Text, md)
	}
}

func TestErrorsCarryStatusAndConnectionSurvives(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Fail", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, kernel.Errorf(kernel.NotFound, "no such %s", req.Text)
		})
		kernrpc.Handle(s, "Echo.Panic", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			panic("handler bug")
		})
		kernrpc.Handle(s, "Echo.BadReply", func(ctx context.Context, req *echopb.Echo) (*wrapperspb.StringValue, error) {
			// protobuf's reflective encoder refuses it (echopb.Echo has
			// vtprotobuf methods, which do not check UTF-8).
			return wrapperspb.String("\xff\xfe not utf-8"), nil
		})
		kernrpc.Handle(s, "Echo.Plain", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, errors.New("plain error")
		})
	})
	cli := newClient(t, cfg)
	cases := []struct {
		method  string
		req     proto.Message
		code    kernel.Code
		message string
	}{
		{"Echo.Fail", &echopb.Echo{Text: "thing"}, kernel.NotFound, "no such thing"},
		{"Echo.Nope", &echopb.Echo{}, kernel.Unimplemented, `method "Echo.Nope" is not served here`},
		{"Echo.Panic", &echopb.Echo{}, kernel.Internal, "panicked: handler bug"},
		{"Echo.BadReply", &echopb.Echo{}, kernel.Internal, "encode response of Echo.BadReply"},
		{"Echo.Plain", &echopb.Echo{}, kernel.Unknown, "plain error"},
		{"Echo.Echo", wrapperspb.String("\xff bad request"), kernel.Internal, "encode request of Echo.Echo"},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			err := cli.Call(context.Background(), tc.method, tc.req, new(wrapperspb.StringValue))
			st := kernel.StatusOf(err)
			if st == nil || st.Code != tc.code || !strings.Contains(st.Message, tc.message) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.code, tc.message)
			}
			var resp echopb.Echo
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "still up"}, &resp); err != nil || resp.Text != "still up" {
				t.Fatalf("call after the failure: %v", err)
			}
		})
	}
}

// rawConn dials the server with the transport alone, to send what a
// well-behaved client never would.
func rawConn(t *testing.T, addr string) kernel.Conn {
	t.Helper()
	tr, err := tcplv.New(tcplv.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func roundTripRaw(t *testing.T, c kernel.Conn, f *kernel.Frame) *kernel.Frame {
	t.Helper()
	if err := c.WriteFrame(f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := c.ReadFrame(ctx)
	if err != nil {
		t.Fatalf("no answer to %v: %v", f.Type, err)
	}
	return got
}

func TestServerAnswersBadRequestsAndKeepsTheConnection(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	c := rawConn(t, srv.Addr())

	// A frame type a server never expects, for a call id nobody uses: ignored.
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 999}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		req  kernel.Frame
		code kernel.Code
		msg  string
	}{
		{"garbage payload", kernel.Frame{Method: "Echo.Echo", Codec: "protobuf", Payload: []byte{0xff, 0xff, 0xff}}, kernel.InvalidArgument, "decode request of Echo.Echo"},
		{"codec not loaded", kernel.Frame{Method: "Echo.Echo", Codec: "xml"}, kernel.InvalidArgument, `codec "xml" is not loaded`},
		{"streaming not supported", kernel.Frame{Method: "Echo.Echo", Flags: kernel.FlagStream}, kernel.Unimplemented, "stream"},
		{"valid request", kernel.Frame{Method: "Echo.Echo", Codec: "protobuf", Payload: []byte{0x12, 0x02, 'o', 'k'}}, kernel.OK, ""},
		// protocol.md: reserved flag bits are ignored, so a later version may use them.
		{"reserved flags", kernel.Frame{Method: "Echo.Echo", Codec: "protobuf", Flags: 0xf8, Payload: []byte{0x12, 0x02, 'o', 'k'}}, kernel.OK, ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Type, req.CallID = kernel.FrameRequest, uint64(i+1)
			req.Flags |= kernel.FlagEndStream
			resp := roundTripRaw(t, c, &req)
			defer resp.Release()
			if resp.Type != kernel.FrameResponse || resp.CallID != req.CallID {
				t.Fatalf("got %v for call %d, want the Response to call %d", resp.Type, resp.CallID, req.CallID)
			}
			if resp.Code != tc.code || !strings.Contains(resp.Message, tc.msg) {
				t.Fatalf("got %v %q, want %v containing %q", resp.Code, resp.Message, tc.code, tc.msg)
			}
		})
	}
}

func TestUnknownPluginInConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Name = "nope"
	_, err := kernrpc.NewServer(cfg)
	if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "tcp-lv") {
		t.Fatalf("err = %v, want it to name nope and list tcp-lv", err)
	}
	cfg = testConfig(t)
	cfg.Transport.Options = map[string]any{"max_frame_sise": "1MiB"}
	_, err = kernrpc.NewClient(cfg, "echo")
	if err == nil || !strings.Contains(err.Error(), `"max_frame_sise"`) || !strings.Contains(err.Error(), `"tcp-lv"`) {
		t.Fatalf("err = %v, want it to name the transport and the key", err)
	}
}

type orderFilter struct {
	name string
	log  *[]string
	mu   *sync.Mutex
}

func (f orderFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	f.mu.Lock()
	*f.log = append(*f.log, info.Side.String()+":"+f.name)
	f.mu.Unlock()
	if info.Side == kernel.ClientSide {
		info.SetRequestMetadata("via-"+f.name, "1")
	}
	if f.name == "deny" && info.Method == "Echo.Secret" {
		return nil, kernel.Errorf(kernel.PermissionDenied, "denied by filter")
	}
	return next(ctx, info, req)
}

var (
	filterLogMu sync.Mutex
	filterLog   []string
)

func init() {
	for _, name := range []string{"first", "second", "deny"} {
		kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-" + name, New: func(any) (kernel.Filter, error) {
			return orderFilter{name: name, log: &filterLog, mu: &filterLogMu}, nil
		}})
	}
}

func TestFiltersRunInConfiguredOrderOnBothSides(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{
		{Name: "test-first"},
		{Name: "test-second"},
		{Name: "test-deny", Side: "server", Methods: []string{"Echo.Sec*"}},
	}
	var seen kernel.Metadata
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Secret", echo)
		kernrpc.Handle(s, "Echo.Look", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			seen = kernrpc.IncomingMetadata(ctx)
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	filterLogMu.Lock()
	filterLog = nil
	filterLogMu.Unlock()
	if err := cli.Call(context.Background(), "Echo.Look", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	filterLogMu.Lock()
	got := strings.Join(filterLog, " ")
	filterLogMu.Unlock()
	if want := "client:first client:second server:first server:second"; got != want {
		t.Errorf("filter order %q, want %q", got, want)
	}
	if seen["via-first"] != "1" || seen["via-second"] != "1" {
		t.Errorf("metadata added by client filters did not arrive: %v", seen)
	}
	err := cli.Call(context.Background(), "Echo.Secret", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.PermissionDenied {
		t.Fatalf("err = %v, want the method-scoped filter to reject with PermissionDenied", err)
	}
}

// holding is an Echo.Hold handler: it says on entered that a call came,
// then holds it until release closes, and echoes it.
func holding(entered chan<- struct{}, release <-chan struct{}) func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
	return func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		entered <- struct{}{}
		<-release
		return req, nil
	}
}
