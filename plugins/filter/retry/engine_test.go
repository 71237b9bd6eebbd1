package retry_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/retry"
)

// testConfig is a service on loopback, in a registry namespace of the
// test's own.
func testConfig(t *testing.T) *kernrpc.Config {
	cfg := enginetest.Config(t)
	cfg.Client.Timeout = kernel.Duration(10 * time.Second)
	return cfg
}

// server is one instance answering Echo.Who with answer, counting the
// calls that reach it.
type server struct {
	calls atomic.Int32
}

func startServer(t *testing.T, cfg *kernrpc.Config, name string, answer func() error) *server {
	t.Helper()
	s := &server{}
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			s.calls.Add(1)
			if err := answer(); err != nil {
				return nil, err
			}
			return wrapperspb.String(name), nil
		})
	})
	return s
}

func newClient(t *testing.T, cfg *kernrpc.Config, options map[string]any) *kernrpc.Client {
	t.Helper()
	return enginetest.Dial(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: retry.Name, Side: "client", Options: options}))
}

func TestRetryReachesAHealthyInstance(t *testing.T) {
	cfg := testConfig(t)
	down := startServer(t, cfg, "down", func() error { return kernel.Errorf(kernel.Unavailable, "dependency down") })
	up := startServer(t, cfg, "up", func() error { return nil })
	// Half the first attempts fail: a refund of a whole token per success
	// keeps the budget level (the default tenth allows about one retry in
	// ten calls, and would stop these retries after a few).
	cli := newClient(t, cfg, map[string]any{"backoff": "1ms", "budget": map[string]any{"refund": 1}})
	const calls = 20
	for i := range calls {
		var resp wrapperspb.StringValue
		if err := cli.Call(t.Context(), "Echo.Who", wrapperspb.String(""), &resp); err != nil || resp.GetValue() != "up" {
			t.Fatalf("call %d: %v, %q; want the retry to reach the healthy instance", i, err, resp.GetValue())
		}
	}
	if down.calls.Load() == 0 || up.calls.Load() != calls {
		t.Errorf("calls: down %d, up %d; want the failing one tried and every call answered by up", down.calls.Load(), up.calls.Load())
	}
	t.Logf("%d calls: %d reached the failing instance and were retried, all %d answered by the healthy one", calls, down.calls.Load(), up.calls.Load())
}

// During a total outage, the retries reaching the servers stay within
// the budget: tokens/2 plus what the refill adds, however many calls are
// made and however many callers make them at once.
func TestOutageRetriesStayWithinTheBudget(t *testing.T) {
	cfg := testConfig(t)
	var servers []*server
	for _, name := range []string{"a", "b", "c"} {
		servers = append(servers, startServer(t, cfg, name, func() error { return kernel.Errorf(kernel.Unavailable, "dependency down") }))
	}
	const (
		tokens      = 10
		refill      = 1.0 // per second
		maxAttempts = 5
		callers     = 8
		callsEach   = 50
	)
	cli := newClient(t, cfg, map[string]any{
		"max_attempts": maxAttempts, "backoff": "1ms", "max_backoff": "4ms",
		"budget": map[string]any{"tokens": tokens, "refund": 0.1, "refill_per_second": refill},
	})
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range callers {
		wg.Go(func() {
			for range callsEach {
				if err := cli.Call(t.Context(), "Echo.Who", wrapperspb.String(""), &wrapperspb.StringValue{}); kernel.CodeOf(err) == kernel.Unavailable {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	const calls = callers * callsEach
	var attempts int32
	for _, s := range servers {
		attempts += s.calls.Load()
	}
	retries := int(attempts) - calls
	// The refill is what elapsed earned, counted generously (one more
	// second), so that a slow machine does not fail the bound.
	bound := tokens/2 + int(refill*(elapsed.Seconds()+1))
	t.Logf("outage: %d calls from %d callers in %v: %d attempts reached the servers, %d retries (budget bound %d; max_attempts alone would allow %d)",
		calls, callers, elapsed.Round(time.Millisecond), attempts, retries, bound, calls*(maxAttempts-1))
	if failed.Load() != calls {
		t.Errorf("%d of %d calls failed Unavailable, want all", failed.Load(), calls)
	}
	if retries < 0 || retries > bound {
		t.Errorf("%d retries reached the servers during the outage; want at most %d (tokens/2 + refill)", retries, bound)
	}
	if retries == 0 {
		t.Error("no retry at all: the budget starts full and should allow a few")
	}
}

// A non-idempotent method is not retried after a server processed it,
// though its code is retryable.
func TestNonIdempotentIsNotRetriedOnceProcessed(t *testing.T) {
	cfg := testConfig(t)
	var servers []*server
	for _, name := range []string{"a", "b"} {
		servers = append(servers, startServer(t, cfg, name, func() error { return kernel.Errorf(kernel.Unavailable, "charged, then failed") }))
	}
	cli := newClient(t, cfg, map[string]any{"backoff": "1ms", "non_idempotent": []any{"Echo.*"}})
	err := cli.Call(t.Context(), "Echo.Who", wrapperspb.String(""), &wrapperspb.StringValue{})
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("err = %v, want the server's Unavailable", err)
	}
	if n := servers[0].calls.Load() + servers[1].calls.Load(); n != 1 {
		t.Errorf("the servers saw %d attempts, want 1", n)
	}
}

// A retry whose last attempt ends with no answer (the caller gave up while
// it waited) returns no response metadata: what the earlier attempt's
// answer carried is not the call's.
func TestARetryEndingWithoutAnAnswerReturnsNoEarlierMetadata(t *testing.T) {
	cfg := testConfig(t)
	second := make(chan struct{})
	var calls atomic.Int32
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			if calls.Add(1) == 1 {
				kernrpc.CallInfoFrom(ctx).SetResponseMetadata("from", "the first attempt")
				return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
			}
			close(second)
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	cli := newClient(t, cfg, map[string]any{"max_attempts": 2, "backoff": "1ms"})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-second
		cancel()
	}()
	md, err := cli.CallWithMetadata(ctx, "Echo.Who", wrapperspb.String(""), &wrapperspb.StringValue{})
	if kernel.CodeOf(err) != kernel.Canceled {
		t.Fatalf("err = %v, want Canceled: the caller gave up during the second attempt", err)
	}
	if md != nil {
		t.Errorf("response metadata = %v, want none: the last attempt got no answer, and the first's is not the call's", md)
	}
}

// perTryTimeout gives each attempt a deadline of its own, shorter than
// the call's: a per-try timeout, placed after the retry filter.
type perTryTimeout struct{}

func (perTryTimeout) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	return next(ctx, info, req)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-per-try-timeout", New: func(any) (kernel.Filter, error) { return perTryTimeout{}, nil }})
}

// A retry whose last attempt ends without an answer because of its own
// deadline (a filter's per-try timeout), while the call's context lives
// on, returns no response metadata either: that attempt is the call's
// last, and the first attempt's answer is not the call's.
func TestAnAttemptEndedByItsOwnDeadlineReturnsNoEarlierMetadata(t *testing.T) {
	cfg := testConfig(t)
	var calls atomic.Int32
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			if calls.Add(1) == 1 {
				kernrpc.CallInfoFrom(ctx).SetResponseMetadata("from", "the first attempt")
				return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
			}
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	cli := enginetest.Dial(t, enginetest.WithFilters(cfg,
		kernrpc.FilterConfig{Name: retry.Name, Side: "client", Options: map[string]any{"max_attempts": 2, "backoff": "1ms"}},
		kernrpc.FilterConfig{Name: "test-per-try-timeout", Side: "client"}))
	md, err := cli.CallWithMetadata(t.Context(), "Echo.Who", wrapperspb.String(""), &wrapperspb.StringValue{})
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || calls.Load() != 2 {
		t.Fatalf("err = %v after %d attempts, want DeadlineExceeded: the second attempt's own deadline passed", err, calls.Load())
	}
	if md != nil {
		t.Errorf("response metadata = %v, want none: the last attempt got no answer, and the first's is not the call's", md)
	}
}
