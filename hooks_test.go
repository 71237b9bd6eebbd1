package kernrpc_test

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// ended is one CallEnded a hooks filter was told of.
type ended struct {
	method       string
	code         kernel.Code
	handled      bool
	request, out int
}

// hooks is a server filter that refuses calls whose metadata says so
// before they are decoded (an Admitter), hands the handler the caller's
// "who" metadata under whoKey (a ContextValuer), and keeps every call it
// is told has ended (a CallObserver).
type hooks struct {
	mu     sync.Mutex
	ended  []ended
	valued int
}

type whoKey struct{}

// otherKey wraps a context in a value of its own, so that a lookup of
// whoKey has to pass it.
type otherKey struct{}

func (h *hooks) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (h *hooks) Admit(_ context.Context, info *kernel.CallInfo) error {
	if info.Metadata["refuse"] != "" {
		return kernel.Errorf(kernel.PermissionDenied, "refused by the test")
	}
	if info.Metadata["panic-on-admit"] != "" {
		panic("Admit panics, as the test asked")
	}
	return nil
}

// CallTimeout gives no call a timeout, but panics for one that asks it to.
func (h *hooks) CallTimeout(info *kernel.CallInfo) time.Duration {
	if info.Metadata["panic-on-timeout"] != "" {
		panic("CallTimeout panics, as the test asked")
	}
	return 0
}

func (h *hooks) CallValue(info *kernel.CallInfo, key any) (any, bool) {
	if key != (whoKey{}) {
		return nil, false
	}
	h.mu.Lock()
	h.valued++
	h.mu.Unlock()
	return info.Metadata["who"], true
}

func (h *hooks) CallEnded(info *kernel.CallInfo, err error, handled bool) {
	if info.Metadata["panic-on-end"] != "" {
		panic("CallEnded panics, as the test asked")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = append(h.ended, ended{info.Method, kernel.CodeOf(err), handled, info.RequestSize, info.ResponseSize})
}

var (
	_ kernel.Admitter      = (*hooks)(nil)
	_ kernel.ContextValuer = (*hooks)(nil)
	_ kernel.CallObserver  = (*hooks)(nil)
	_ kernel.Deadliner     = (*hooks)(nil)
)

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-hooks", New: func(any) (kernel.Filter, error) { return &hooks{}, nil }})
}

func TestServerFilterHooks(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-hooks", Side: "server"}}
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Who", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			who, _ := context.WithValue(ctx, otherKey{}, 1).Value(whoKey{}).(string)
			if again, _ := ctx.Value(whoKey{}).(string); again != who {
				return nil, kernel.Errorf(kernel.Internal, "whoKey read %q, then %q", who, again)
			}
			return &echopb.Echo{Text: who + ":" + req.Text}, nil
		})
	})
	h, ok := kernrpc.FindPlugin[*hooks](srv.Plugins(), "test-hooks")
	if !ok {
		t.Fatal("hooks filter not built")
	}
	cli := newClient(t, cfg)
	ctx := context.Background()

	var out echopb.Echo
	if err := cli.Call(kernrpc.WithMetadata(ctx, kernel.Metadata{"who": "ann"}), "Echo.Who", &echopb.Echo{Text: "hi"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.Text != "ann:hi" {
		t.Errorf("handler read %q through its context, want %q", out.Text, "ann:hi")
	}
	err := cli.Call(kernrpc.WithMetadata(ctx, kernel.Metadata{"refuse": "1"}), "Echo.Who", &echopb.Echo{Text: "no"}, &out)
	if kernel.CodeOf(err) != kernel.PermissionDenied {
		t.Fatalf("refused call: %v, want PermissionDenied", err)
	}
	// A request that does not decode: a string field cut short.
	resp := roundTripRaw(t, rawConn(t, srv.Addr()), &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Echo.Who", Codec: "protobuf", Payload: []byte{0x0a, 0x05, 'a'}})
	if resp.Code != kernel.InvalidArgument {
		t.Fatalf("undecodable call: %v %q, want InvalidArgument", resp.Code, resp.Message)
	}
	resp.Release()
	// A request in a codec the server cannot build.
	resp = roundTripRaw(t, rawConn(t, srv.Addr()), &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Echo.Who", Codec: "yaml", Payload: []byte("text: hi")})
	if resp.Code != kernel.InvalidArgument {
		t.Fatalf("call in an unknown codec: %v %q, want InvalidArgument", resp.Code, resp.Message)
	}
	resp.Release()

	// CallEnded runs after the answer is written, so the client may have
	// its answer first: wait for all four, in whatever order.
	eventually(5*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ended) >= 4
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	slices.SortFunc(h.ended, func(a, b ended) int { return cmp.Or(cmp.Compare(a.code, b.code), cmp.Compare(a.request, b.request)) })
	if h.valued != 1 {
		t.Errorf("CallValue answered %d times for two lookups, want 1: the server keeps the answer", h.valued)
	}
	if len(h.ended) != 4 {
		t.Fatalf("CallEnded was called %d times, want 4: %+v", len(h.ended), h.ended)
	}
	want := []ended{
		{"Echo.Who", kernel.OK, true, 4, len("ann:hi") + 2},
		{"Echo.Who", kernel.InvalidArgument, false, 3, 0},
		{"Echo.Who", kernel.InvalidArgument, false, 8, 0},
		{"Echo.Who", kernel.PermissionDenied, false, 4, 0},
	}
	for i, w := range want {
		if h.ended[i] != w {
			t.Errorf("call %d ended as %+v, want %+v", i, h.ended[i], w)
		}
	}
}

// A filter's hook that panics is a bug of that filter, not a crash of the
// server. A CallObserver's costs a log line: the answer is already out. An
// Admitter's or a Deadliner's fails that call with Internal, naming the
// panic. All are logged at ERROR with the stack, and the server keeps
// serving.
func TestFilterHookPanicsKeepTheServerUp(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-hooks", Side: "server"}}
	startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	ctx := context.Background()
	var out echopb.Echo
	if err := cli.Call(kernrpc.WithMetadata(ctx, kernel.Metadata{"panic-on-end": "1"}), "Echo.Echo", &echopb.Echo{Text: "a"}, &out); err != nil || out.Text != "a" {
		t.Fatalf("the call whose CallEnded panics: %v %q, want its answer", err, out.Text)
	}
	err := cli.Call(kernrpc.WithMetadata(ctx, kernel.Metadata{"panic-on-admit": "1"}), "Echo.Echo", &echopb.Echo{Text: "b"}, &out)
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "a filter admitting Echo.Echo panicked: Admit panics, as the test asked") {
		t.Errorf("the call whose Admit panics: %v; want Internal naming the panic", err)
	}
	err = cli.Call(kernrpc.WithMetadata(ctx, kernel.Metadata{"panic-on-timeout": "1"}), "Echo.Echo", &echopb.Echo{Text: "b"}, &out)
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "a filter timing Echo.Echo panicked: CallTimeout panics, as the test asked") {
		t.Errorf("the call whose CallTimeout panics: %v; want Internal naming the panic", err)
	}
	for i := range 3 {
		if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "c"}, &out); err != nil {
			t.Fatalf("call %d after the panics: %v", i, err)
		}
	}
	// CallEnded runs once the answer is sent: its line may come after it.
	eventually(5*time.Second, func() bool { return strings.Contains(logs.String(), "CallEnded panicked") })
	for _, want := range []string{`level=ERROR msg="filter's Admit panicked"`, `level=ERROR msg="filter's CallTimeout panicked"`, `level=ERROR msg="filter's CallEnded panicked"`, "hooks_test.go"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
}

// A handler's error that claims OK (a *kernel.Status with code OK) goes to
// the caller as Unknown, since an error is no answer; CallObservers (a
// metrics counter, a tracing span) are told the same code, not OK.
func TestAnErrorClaimingOKEndsUnknownForObserversToo(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-hooks", Side: "server"}}
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Odd", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, &kernel.Status{Code: kernel.OK, Message: "an error that says OK"}
		})
	})
	h, _ := kernrpc.FindPlugin[*hooks](srv.Plugins(), "test-hooks")
	err := newClient(t, cfg).Call(context.Background(), "Echo.Odd", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Unknown || !strings.Contains(err.Error(), "an error that says OK") {
		t.Fatalf("call: %v, want Unknown with the handler's message", err)
	}
	eventually(5*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ended) >= 1
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ended) != 1 || h.ended[0].code != kernel.Unknown {
		t.Errorf("CallEnded was told %+v; want one call ended Unknown, as the caller got it", h.ended)
	}
}
