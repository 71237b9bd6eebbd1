package kernrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// The filters below are what the governance plugins will be, cut to the
// one behaviour each test pins: answer alone, retry, hedge, refuse a host.
func init() {
	kernel.RegisterFilter(kernel.NewFactory("test-cache", "test: answers from a fixed cache",
		func() *cacheOptions { return &cacheOptions{} },
		func(o *cacheOptions) (kernel.Filter, error) { return &cacheFilter{text: o.Text}, nil }))
	kernel.RegisterFilter(kernel.NewFactory("test-hedge", "test: two attempts at once, the first answer wins",
		func() *hedgeOptions { return &hedgeOptions{} },
		func(o *hedgeOptions) (kernel.Filter, error) { return &hedgeFilter{opts: *o}, nil }))
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-retry", New: func(any) (kernel.Filter, error) { return &retryFilter{}, nil }})
	kernel.RegisterFilter(kernel.NewFactory("test-refuse", "test: an attempt filter refusing one address",
		func() *refuseOptions { return &refuseOptions{} },
		func(o *refuseOptions) (kernel.Filter, error) { return &refuseFilter{addr: o.Address}, nil }))
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-answer-or-replace", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(answerOrReplace), nil
	}})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-both", New: func(any) (kernel.Filter, error) {
		return &bothFilter{seen: make(chan answer, 2)}, nil
	}})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-admit", New: func(any) (kernel.Filter, error) { return &admitFilter{}, nil }})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-empty", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) { return nil, nil }), nil
	}})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-wrong-type", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) { return "cached text", nil }), nil
	}})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-detach", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(_ context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(context.Background(), info, req)
		}), nil
	}})
}

// answerOrReplace is a server filter that answers by itself when asked to,
// and otherwise replaces the handler's answer.
func answerOrReplace(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Metadata["answer"] == "filter" {
		return &echopb.Echo{Text: "from the filter"}, nil
	}
	resp, err := next(ctx, info, req)
	if err != nil {
		return nil, err
	}
	return &echopb.Echo{Text: "replaced " + resp.(*echopb.Echo).Text}, nil
}

// bothFilter sends two attempts at once, waits for both, reports what
// each answered on seen, and returns the second.
type bothFilter struct{ seen chan answer }

type answer struct {
	resp any
	text string
}

func (f *bothFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	var wg sync.WaitGroup
	resps := make([]any, 2)
	for i := range 2 {
		ci := *info
		wg.Add(1)
		go func() { defer wg.Done(); resps[i], _ = next(ctx, &ci, req) }()
	}
	wg.Wait()
	for _, r := range resps {
		e, _ := r.(*echopb.Echo)
		f.seen <- answer{r, e.GetText()}
	}
	return resps[1], nil
}

type cacheOptions struct {
	Text string `json:"text"`
}

// cacheFilter answers every call itself with a fresh value, as a cache
// answering from its store would.
type cacheFilter struct {
	text  string
	calls atomic.Int32
}

func (f *cacheFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	f.calls.Add(1)
	return &echopb.Echo{Text: f.text}, nil
}

type hedgeOptions struct {
	// ShareInfo passes one CallInfo to both attempts, as a careless hedge
	// would: the engine must still be race-free.
	ShareInfo bool `json:"share_info"`
}

// hedgeFilter sends two attempts at once and returns the first success,
// cancelling the other.
type hedgeFilter struct{ opts hedgeOptions }

func (f *hedgeFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		resp any
		err  error
		info *kernel.CallInfo
	}
	results := make(chan result, 2)
	var wg sync.WaitGroup
	for range 2 {
		ci := info
		if !f.opts.ShareInfo {
			copied := *info
			ci = &copied
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := next(ctx, ci, req)
			results <- result{resp, err, ci}
		}()
	}
	var last result
	for range 2 {
		r := <-results
		if r.err == nil {
			cancel()
			if !f.opts.ShareInfo {
				info.ResponseMetadata = r.info.ResponseMetadata
			}
			wg.Wait()
			return r.resp, nil
		}
		last = r
	}
	return nil, last.err
}

// retryFilter sends a call again when it ended Unavailable.
type retryFilter struct{}

func (retryFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	resp, err := next(ctx, info, req)
	if kernel.CodeOf(err) == kernel.Unavailable {
		return next(ctx, info, req)
	}
	return resp, err
}

type refuseOptions struct {
	Address string `json:"address"`
}

// refuseFilter runs in the attempt stage and refuses one instance, as a
// breaker open for that host would.
type refuseFilter struct {
	addr    string
	refused atomic.Int32
}

func (*refuseFilter) Stage() kernel.Stage { return kernel.AttemptStage }

func (f *refuseFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Instance.Address == f.addr {
		n := f.refused.Add(1)
		return nil, fmt.Errorf("test-refuse: %s is refused (refusal %d): %w", f.addr, n, kernel.ErrInstanceRefused)
	}
	return next(ctx, info, req)
}

// namedServer serves Echo.Who, answering with name, and counts its calls.
type namedServer struct {
	srv   *kernrpc.Server
	calls atomic.Int32
}

func startNamed(t *testing.T, cfg *kernrpc.Config, name string, who func(ctx context.Context) (*echopb.Echo, error)) *namedServer {
	t.Helper()
	ns := &namedServer{}
	if who == nil {
		who = func(context.Context) (*echopb.Echo, error) { return &echopb.Echo{Text: name}, nil }
	}
	ns.srv = startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Who", func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
			ns.calls.Add(1)
			kernrpc.CallInfoFrom(ctx).SetResponseMetadata("from", name)
			return who(ctx)
		})
	})
	return ns
}

func withFilters(cfg *kernrpc.Config, filters ...kernrpc.FilterConfig) *kernrpc.Config {
	c := *cfg
	c.Filters = filters
	return &c
}

func TestCachingFilterAnswersWithoutAnyServer(t *testing.T) {
	cfg := withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-cache", Side: "client", Options: map[string]any{"text": "cached"}})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := &echopb.Echo{Text: "stale"}
	if err := cli.Call(ctx, "Echo.Who", &echopb.Echo{}, resp); err != nil {
		t.Fatalf("call answered by the filter: %v", err)
	}
	if resp.Text != "cached" {
		t.Errorf("reply = %q, want the filter's answer %q in the caller's reply", resp.Text, "cached")
	}
	f, ok := kernrpc.FindPlugin[*cacheFilter](cli.Plugins(), "test-cache")
	if !ok || f.calls.Load() != 1 {
		t.Errorf("FindPlugin = %v, %v; want the client's cache filter, called once", f, ok)
	}
}

func TestHedgeReturnsTheFastAnswerAndTheSlowServerSeesTheCancel(t *testing.T) {
	for _, share := range []bool{false, true} {
		t.Run(fmt.Sprintf("share_info=%v", share), func(t *testing.T) {
			cfg := testConfig(t)
			cancelled := make(chan error, 8)
			slowStarted := make(chan struct{}, 8)
			startNamed(t, cfg, "slow", func(ctx context.Context) (*echopb.Echo, error) {
				slowStarted <- struct{}{}
				<-ctx.Done()
				cancelled <- ctx.Err()
				return nil, ctx.Err()
			})
			// The fast one answers once the slow one has its request, so
			// that the cancel has something to reach.
			startNamed(t, cfg, "fast", func(ctx context.Context) (*echopb.Echo, error) {
				select {
				case <-slowStarted:
				case <-ctx.Done():
				}
				return &echopb.Echo{Text: "fast"}, nil
			})
			cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-hedge", Side: "client", Options: map[string]any{"share_info": share}}))
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var resp echopb.Echo
				md, err := cli.CallWithMetadata(ctx, "Echo.Who", &echopb.Echo{}, &resp)
				cancel()
				if err != nil || resp.Text != "fast" {
					t.Fatalf("call %d: %v, reply %q; want the fast server's answer", i, err, resp.Text)
				}
				if md["from"] != "fast" {
					t.Errorf("call %d: response metadata %v; want the fast server's, not the cancelled attempt's", i, md)
				}
				if err := receive(t, cancelled, 5*time.Second, "the slow server never saw its attempt cancelled"); !errors.Is(err, context.Canceled) {
					t.Errorf("slow server's context ended with %v, want Canceled", err)
				}
			}
		})
	}
}

func TestRetryAfterUnavailableReachesTheOtherInstance(t *testing.T) {
	cfg := testConfig(t)
	down := startNamed(t, cfg, "down", func(context.Context) (*echopb.Echo, error) {
		return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
	})
	up := startNamed(t, cfg, "up", nil)
	cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-retry", Side: "client"}))
	for i := range 4 {
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil || resp.Text != "up" {
			t.Fatalf("call %d: %v, reply %q; want the retry to reach the healthy instance", i, err, resp.Text)
		}
	}
	if down.calls.Load() == 0 || up.calls.Load() != 4 {
		t.Errorf("calls: down %d, up %d; want the failing one tried and every call answered by up", down.calls.Load(), up.calls.Load())
	}
}

func TestAttemptFilterRefusingAnInstanceSendsEveryCallToTheOthers(t *testing.T) {
	cfg := testConfig(t)
	refused := startNamed(t, cfg, "refused", nil)
	others := []*namedServer{startNamed(t, cfg, "a", nil), startNamed(t, cfg, "b", nil)}
	// No stage in the config: the filter declares the attempt stage.
	cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-refuse", Side: "client", Options: map[string]any{"address": refused.srv.Addr()}}))
	const calls = 30
	for i := range calls {
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := refused.calls.Load(); n != 0 {
		t.Errorf("the refused instance served %d calls, want 0", n)
	}
	if a, b := others[0].calls.Load(), others[1].calls.Load(); a+b != calls || a == 0 || b == 0 {
		t.Errorf("the others served %d and %d calls; want all %d spread over both", a, b, calls)
	}
	f, _ := kernrpc.FindPlugin[*refuseFilter](cli.Plugins(), "test-refuse")
	if f == nil || f.refused.Load() == 0 {
		t.Error("the attempt filter never saw the refused instance: did it run after the pick?")
	}
}

func TestAttemptFilterRefusingEveryInstanceFailsTheCallSayingSo(t *testing.T) {
	cfg := testConfig(t)
	only := startNamed(t, cfg, "only", nil)
	cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-refuse", Side: "client", Stage: "attempt", Options: map[string]any{"address": only.srv.Addr()}}))
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), only.srv.Addr()) {
		t.Fatalf("err = %v, want Unavailable saying the attempt filters refused %s", err, only.srv.Addr())
	}
	if only.calls.Load() != 0 {
		t.Error("a refused instance was called")
	}
	// The error quotes the last refusal, as the breaker's doc says, not
	// the one before it.
	f, _ := kernrpc.FindPlugin[*refuseFilter](cli.Plugins(), "test-refuse")
	if last := fmt.Sprintf("(refusal %d)", f.refused.Load()); !strings.Contains(err.Error(), last) {
		t.Errorf("err = %v, want it to quote the last refusal, %s", err, last)
	}
}

func TestServerFilterMayAnswerOrReplaceTheResponse(t *testing.T) {
	cfg := testConfig(t)
	handled := startNamed(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-answer-or-replace", Side: "server"}), "handler", nil)
	cli := newClient(t, cfg)
	for _, tc := range []struct{ answer, want string }{{"filter", "from the filter"}, {"", "replaced handler"}} {
		ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"answer": tc.answer})
		var resp echopb.Echo
		if err := cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &resp); err != nil || resp.Text != tc.want {
			t.Errorf("answer=%q: %v, %q; want %q", tc.answer, err, resp.Text, tc.want)
		}
	}
	if handled.calls.Load() != 1 {
		t.Errorf("handler ran %d times, want once: the filter answered the other call", handled.calls.Load())
	}
}

func TestFilterPassingAContextNotFromTheCallGetsAnError(t *testing.T) {
	cfg := testConfig(t)
	startNamed(t, cfg, "x", nil)
	cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-detach", Side: "client"}))
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "ctx the filter received") {
		t.Fatalf("err = %v, want Internal telling the filter author to pass on its ctx", err)
	}
}

func TestNoInstanceFailsAtTheDeadlineSayingWhatToCheck(t *testing.T) {
	cfg := testConfig(t)
	cfg.Client.Timeout = kernel.Duration(150 * time.Millisecond)
	cfg.Source = "svc.yaml"
	cli := newClient(t, cfg)
	start := time.Now()
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("failed after %v; want it to wait for an instance up to the deadline", el)
	}
	for _, want := range []string{`no instance of "echo"`, "client.timeout (150ms in svc.yaml)", "check that a server", `registry "memory"`} {
		if !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("err = %v; want it to say %q", err, want)
		}
	}
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Errorf("code = %v, want Unavailable", kernel.CodeOf(err))
	}
}

func TestDeadlineErrorSaysWhichDeadline(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Sleep", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	cfg.Client.Timeout = kernel.Duration(100 * time.Millisecond)
	cli := newClient(t, cfg)
	err := cli.Call(context.Background(), "Echo.Sleep", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), "client.timeout (100ms") || !strings.Contains(err.Error(), "Echo.Sleep") {
		t.Errorf("err = %v; want DeadlineExceeded naming client.timeout and the method", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = cli.Call(ctx, "Echo.Sleep", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), "deadline of the call's context") {
		t.Errorf("err = %v; want DeadlineExceeded naming the context's deadline", err)
	}
}

// A hedge's two attempts must not share the caller's reply: the losing
// one decodes into a value of its own (or nowhere, once the call is over).
func TestConcurrentAttemptsDecodeIntoValuesOfTheirOwn(t *testing.T) {
	cfg := testConfig(t)
	startNamed(t, cfg, "one", nil)
	startNamed(t, cfg, "two", nil)
	cli := newClient(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-both", Side: "client"}))
	both, _ := kernrpc.FindPlugin[*bothFilter](cli.Plugins(), "test-both")
	seen := both.seen
	reply := &echopb.Echo{}
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, reply); err != nil {
		t.Fatal(err)
	}
	a, b := <-seen, <-seen
	if a.resp == nil || b.resp == nil || a.resp == b.resp {
		t.Fatalf("attempts answered %p and %p; want two distinct values", a.resp, b.resp)
	}
	if a.text == b.text {
		t.Errorf("both attempts answered %q; want one from each instance", a.text)
	}
	if reply.Text != b.text {
		t.Errorf("caller's reply %q, want the answer the filter returned, %q", reply.Text, b.text)
	}
}

func TestFilterAnsweringNothingIsAnErrorNotAnEmptySuccess(t *testing.T) {
	cli := newClient(t, withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-empty", Side: "client"}))
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{Text: "stale"})
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "neither a response nor an error") {
		t.Fatalf("err = %v; want Internal saying the filter returned nothing", err)
	}
}

// A client filter that answers by itself with a value the codec cannot
// copy into the caller's reply fails the call with Internal, naming both
// types, rather than leaving the reply as it was.
func TestFilterAnsweringAValueTheCodecCannotCopyIsInternal(t *testing.T) {
	cli := newClient(t, withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-wrong-type", Side: "client"}))
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "a client filter answered Echo.Who with a string that protobuf cannot copy into the caller's *echopb.Echo") {
		t.Fatalf("err = %v; want Internal naming the filter's answer and the reply's type", err)
	}
}

// admitFilter refuses calls whose metadata says deny, before the request
// is decoded, and counts what reaches Invoke.
type admitFilter struct{ admitted, invoked atomic.Int32 }

func (f *admitFilter) Admit(ctx context.Context, info *kernel.CallInfo) error {
	if info.Metadata["deny"] != "" {
		return kernel.Errorf(kernel.Unauthenticated, "test-admit: denied")
	}
	f.admitted.Add(1)
	return nil
}

func (f *admitFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	f.invoked.Add(1)
	return next(ctx, info, req)
}

func TestAdmitterDecidesBeforeTheRequestIsDecoded(t *testing.T) {
	cfg := testConfig(t)
	ns := startNamed(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-admit", Side: "server"}), "guarded", nil)
	f, _ := kernrpc.FindPlugin[*admitFilter](ns.srv.Plugins(), "test-admit")
	c := rawConn(t, ns.srv.Addr())
	// A payload that is not protobuf: decoding it would fail with
	// InvalidArgument, so a refusal proves Admit ran first.
	garbage := []byte{0xff, 0xff, 0xff}
	deny := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "Echo.Who", Codec: "protobuf",
		Metadata: kernel.Metadata{"deny": "yes"}, Payload: garbage}
	resp := roundTripRaw(t, c, deny)
	if resp.Code != kernel.Unauthenticated {
		t.Errorf("denied call answered %v %q; want Unauthenticated from Admit, before decoding", resp.Code, resp.Message)
	}
	resp.Release()
	allow := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2, Method: "Echo.Who", Codec: "protobuf", Payload: garbage}
	resp = roundTripRaw(t, c, allow)
	if resp.Code != kernel.InvalidArgument {
		t.Errorf("admitted garbage answered %v %q; want InvalidArgument from decoding", resp.Code, resp.Message)
	}
	resp.Release()
	if f.admitted.Load() != 1 || f.invoked.Load() != 0 || ns.calls.Load() != 0 {
		t.Errorf("admitted %d, invoked %d, handled %d; want 1, 0, 0", f.admitted.Load(), f.invoked.Load(), ns.calls.Load())
	}
}
