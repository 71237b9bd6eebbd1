package hedge_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/hedge"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	t.Run("FixedDelay", func(t *testing.T) {
		plugintest.Filter(t, hedge.Factory, plugintest.FilterConfig{
			Options:       map[string]any{"delay": "5ms", "max_attempts": 3},
			BadOptions:    map[string]any{"max_attempts": 6},
			BadOptionsKey: "max_attempts",
		})
	})
	t.Run("Defaults", func(t *testing.T) {
		plugintest.Filter(t, hedge.Factory, plugintest.FilterConfig{
			BadOptions:    map[string]any{"percentile": 100},
			BadOptionsKey: "percentile",
		})
	})
}

func TestBadOptionsAreNamed(t *testing.T) {
	for key, value := range map[string]any{
		"max_attempts":    0,
		"delay":           "-1s",
		"percentile":      0,
		"retryable_codes": []any{"OK"},
		"non_idempotent":  []any{""},
		"budget":          map[string]any{"refund": -1},
	} {
		_, err := hedge.Factory.Build(map[string]any{key: value}, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), `option "`+key) {
			t.Errorf("%s: %v: err = %v, want one naming the option", key, value, err)
		}
	}
}

func build(t *testing.T, edit func(o *hedge.Options)) *hedge.Filter {
	t.Helper()
	o := hedge.DefaultOptions()
	o.Delay = kernel.Duration(10 * time.Millisecond)
	if edit != nil {
		edit(o)
	}
	f, err := hedge.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.(*hedge.Filter).Close() })
	return f.(*hedge.Filter)
}

// instances is a next whose attempts behave by their number (from 1):
// each answers after its delay unless cancelled, with its error if any.
type instances struct {
	delays    []time.Duration // by attempt; missing: at once
	errs      []error         // by attempt; missing: success
	mu        sync.Mutex
	n         int
	cancelled int
}

func (in *instances) next(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
	in.mu.Lock()
	in.n++
	n := in.n
	in.mu.Unlock()
	var d time.Duration
	if n <= len(in.delays) {
		d = in.delays[n-1]
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		in.mu.Lock()
		in.cancelled++
		in.mu.Unlock()
		return nil, kernel.StatusOf(ctx.Err())
	}
	info.Instance = &kernel.Instance{Address: "instance-" + strconv.Itoa(n)}
	info.Attempt = n
	info.ResponseMetadata = kernel.Metadata{"from": strconv.Itoa(n)}
	if n <= len(in.errs) && in.errs[n-1] != nil {
		return nil, in.errs[n-1]
	}
	return "answer " + strconv.Itoa(n), nil
}

func (in *instances) counts() (attempts, cancelled int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n, in.cancelled
}

func call(f *hedge.Filter, ctx context.Context, next kernel.Invoker) (*kernel.CallInfo, any, error) {
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Metadata: kernel.Metadata{"k": "v"}}
	resp, err := f.Invoke(ctx, info, "req", next)
	return info, resp, err
}

func TestSlowFirstAttemptLosesToTheHedge(t *testing.T) {
	f := build(t, nil)
	in := &instances{delays: []time.Duration{10 * time.Second}}
	start := time.Now()
	info, resp, err := call(f, t.Context(), in.next)
	if err != nil || resp != "answer 2" {
		t.Fatalf("got (%v, %v), want the hedge's answer", resp, err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("the call took %v: it waited for the slow attempt", el)
	}
	if attempts, cancelled := in.counts(); attempts != 2 || cancelled != 1 {
		t.Errorf("%d attempts, %d cancelled; want 2, the slow one cancelled", attempts, cancelled)
	}
	if info.ResponseMetadata["from"] != "2" || info.Attempt != 2 || info.Instance.Address != "instance-2" {
		t.Errorf("the caller's info says %v, attempt %d, %v; want the winner's (2)", info.ResponseMetadata, info.Attempt, info.Instance)
	}
	if f.Hedges() != 1 {
		t.Errorf("Hedges() = %d, want 1", f.Hedges())
	}
}

func TestFastCallIsNotHedged(t *testing.T) {
	f := build(t, nil)
	for range 100 {
		in := &instances{}
		if _, resp, err := call(f, t.Context(), in.next); err != nil || resp != "answer 1" {
			t.Fatalf("got (%v, %v)", resp, err)
		}
	}
	if f.Hedges() != 0 {
		t.Errorf("%d hedges for calls answering at once, want 0", f.Hedges())
	}
}

func TestFinalFailureEndsTheCall(t *testing.T) {
	f := build(t, nil)
	notFound := kernel.Errorf(kernel.NotFound, "no such thing")
	in := &instances{delays: []time.Duration{10 * time.Second, 0}, errs: []error{nil, notFound}}
	_, _, err := call(f, t.Context(), in.next)
	if err != notFound {
		t.Fatalf("err = %v, want the hedge's final %v", err, notFound)
	}
	if _, cancelled := in.counts(); cancelled != 1 {
		t.Errorf("%d attempts cancelled, want the slow first one", cancelled)
	}
}

func TestRetryableFailureStartsTheNextAttemptAtOnce(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(time.Hour); o.MaxAttempts = 3 })
	unavailable := kernel.Errorf(kernel.Unavailable, "down")
	in := &instances{errs: []error{unavailable, unavailable}}
	start := time.Now()
	info, resp, err := call(f, t.Context(), in.next)
	if err != nil || resp != "answer 3" || info.ResponseMetadata["from"] != "3" {
		t.Fatalf("got (%v, %v, %v), want the third attempt's answer", resp, err, info.ResponseMetadata)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v: the failures waited for the delay", el)
	}
	// All of them failing: the last failure is the call's.
	in = &instances{errs: []error{unavailable, unavailable, unavailable}}
	if _, _, err := call(f, t.Context(), in.next); err != unavailable {
		t.Errorf("err = %v, want the last Unavailable", err)
	}
	if attempts, _ := in.counts(); attempts != 3 {
		t.Errorf("%d attempts, want max_attempts, 3", attempts)
	}
}

func TestAtMostMaxAttempts(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(2 * time.Millisecond); o.MaxAttempts = 4 })
	slow := 200 * time.Millisecond
	in := &instances{delays: []time.Duration{slow, slow, slow, slow, slow, slow}}
	if _, _, err := call(f, t.Context(), in.next); err != nil {
		t.Fatal(err)
	}
	if attempts, _ := in.counts(); attempts != 4 {
		t.Errorf("%d attempts, want 4", attempts)
	}
}

func TestCallerCancellingEndsEveryAttempt(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(time.Millisecond); o.MaxAttempts = 3 })
	in := &instances{delays: []time.Duration{time.Hour, time.Hour, time.Hour}}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, _, err := call(f, ctx, in.next)
	if kernel.CodeOf(err) != kernel.Canceled {
		t.Errorf("err = %v, want Canceled", err)
	}
	if attempts, cancelled := in.counts(); attempts != 3 || cancelled != 3 {
		t.Errorf("%d attempts, %d cancelled; want 3 and 3", attempts, cancelled)
	}
}

func TestNonIdempotentIsNeverHedged(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.NonIdempotent = []string{"Echo.*"} })
	in := &instances{delays: []time.Duration{50 * time.Millisecond}}
	if _, resp, err := call(f, t.Context(), in.next); err != nil || resp != "answer 1" || f.Hedges() != 0 {
		t.Errorf("got (%v, %v) after %d hedges; want the only attempt's answer", resp, err, f.Hedges())
	}
}

// Filters after the hedge may add request metadata to their attempt:
// each attempt has a map of its own, with the caller's entries.
func TestEachAttemptHasItsOwnMetadata(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(time.Millisecond); o.MaxAttempts = 3 })
	var wrong atomic.Int32
	stamp := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		if info.Metadata["k"] != "v" {
			wrong.Add(1)
		}
		for i := range 100 {
			info.SetRequestMetadata("stamp", strconv.Itoa(i))
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		return "ok", nil
	}
	caller := kernel.Metadata{"k": "v"}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Metadata: caller}
	if _, err := f.Invoke(t.Context(), info, "req", stamp); err != nil {
		t.Fatal(err)
	}
	if wrong.Load() != 0 {
		t.Errorf("%d attempts lacked the caller's metadata", wrong.Load())
	}
}

// A call whose metadata is an empty map, not nil, still gives each hedge a
// map of its own: what a filter after the hedge adds to the first
// attempt's (an attempt-specific entry) neither reaches the hedges nor
// races with their copying it.
func TestEachAttemptHasItsOwnMetadataFromAnEmptyMap(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(time.Millisecond); o.MaxAttempts = 2 })
	var leaked atomic.Int32
	var first atomic.Bool
	stamp := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		if first.CompareAndSwap(false, true) {
			info.SetRequestMetadata("first-attempt-only", "1")
			<-ctx.Done() // the hedge wins
			return nil, kernel.StatusOf(ctx.Err())
		}
		if _, ok := info.Metadata["first-attempt-only"]; ok {
			leaked.Add(1)
		}
		return "ok", nil
	}
	caller := kernel.Metadata{}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Metadata: caller}
	if _, err := f.Invoke(t.Context(), info, "req", stamp); err != nil {
		t.Fatal(err)
	}
	if leaked.Load() != 0 {
		t.Errorf("the hedge was sent with the entry a later filter added to the first attempt only")
	}
}

// The budget, with a fixed delay and every call slow: hedges stop once it
// is at half, and each success refunds a tenth of one, so that hedging
// adds at most about a tenth to the load. No clock moves: the refill is
// off.
func TestBudgetBoundsHedgesWhenEverythingIsSlow(t *testing.T) {
	f := build(t, func(o *hedge.Options) {
		o.Delay = kernel.Duration(time.Millisecond)
		o.Budget = hedge.BudgetOptions{Tokens: 10, Refund: 0.1}
		o.Now = func() time.Time { return time.Unix(1_000_000, 0) }
	})
	const calls = 200
	attempts := 0
	for range calls {
		in := &instances{delays: []time.Duration{5 * time.Millisecond, 5 * time.Millisecond}}
		if _, _, err := call(f, t.Context(), in.next); err != nil {
			t.Fatal(err)
		}
		n, _ := in.counts()
		attempts += n
	}
	// 4 hedges from the full budget, then one per 10 successes.
	extra := attempts - calls
	if max := 4 + calls/10 + 1; extra > max || extra < 4 {
		t.Errorf("%d hedges for %d slow calls; want 4 to %d", extra, calls, max)
	}
	t.Logf("%d slow calls: %d hedges (%.1f%% extra load)", calls, extra, 100*float64(extra)/calls)
}

func TestObservedDelayFollowsTheMethod(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = 0 })
	fast := func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }
	for range 99 {
		call(f, t.Context(), fast)
	}
	if d := f.Delay("Echo.Who"); d != 0 {
		t.Fatalf("delay %v after 99 calls, want 0: not hedged yet", d)
	}
	for range 200 {
		call(f, t.Context(), fast)
	}
	if d := f.Delay("Echo.Who"); d <= 0 || d > 10*time.Millisecond {
		t.Errorf("delay %v after 300 calls answered at once, want a small positive one", d)
	}
	if d := f.Delay("Other.Method"); d != 0 {
		t.Errorf("another method's delay is %v, want 0: it has its own", d)
	}
}

func TestServerSidePassesThrough(t *testing.T) {
	f := build(t, nil)
	in := &instances{delays: []time.Duration{30 * time.Millisecond}}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide}
	if resp, err := f.Invoke(t.Context(), info, "req", in.next); err != nil || resp != "answer 1" {
		t.Errorf("server side: (%v, %v)", resp, err)
	}
	if n, _ := in.counts(); n != 1 {
		t.Errorf("server side: %d calls of the handler, want 1", n)
	}
}

// BenchmarkInvoke is the filter's cost per call that needs no hedge: a
// trivial next, without the filter, and with it, adaptive (once the
// method is warm, so that every call is armed for a hedge) or fixed, with
// and without request metadata to snapshot.
func BenchmarkInvoke(b *testing.B) {
	next := func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }
	ctx := context.Background()
	for _, md := range []kernel.Metadata{nil, {"tenant": "acme"}} {
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Metadata: md}
		b.Run("metadata="+strconv.Itoa(len(md)), func(b *testing.B) {
			b.Run("without", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					next(ctx, info, "req")
				}
			})
			for _, delay := range []time.Duration{0, time.Millisecond, time.Second} {
				name := "with/delay=adaptive"
				if delay > 0 {
					name = "with/delay=" + delay.String()
				}
				b.Run(name, func(b *testing.B) {
					o := hedge.DefaultOptions()
					o.Delay = kernel.Duration(delay)
					f, _ := hedge.New(o)
					for range 1000 {
						f.Invoke(ctx, info, "req", next)
					}
					b.ReportAllocs()
					for b.Loop() {
						f.Invoke(ctx, info, "req", next)
					}
				})
			}
		})
	}
}

// lateCtx is a context whose deadline has passed before its Done closes,
// as a context derived from the engine's in-place deadline (client.timeout,
// the timeout filter) is for a moment: that deadline's end reaches it on
// a goroutine of its own.
type lateCtx struct {
	context.Context
	deadline time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// A hedge due once the call's deadline has passed is not sent, even if
// the call's context does not say it ended yet: it could only fail, and
// would spend the budget's token and decide the call with its own error.
func TestNoHedgeAfterTheCallsDeadline(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(200 * time.Millisecond) })
	in := &instances{delays: []time.Duration{time.Second}}
	done, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx := lateCtx{done, time.Now().Add(50 * time.Millisecond)}
	_, resp, err := call(f, ctx, in.next)
	if err != nil || resp != "answer 1" {
		t.Fatalf("got (%v, %v), want the first attempt's answer", resp, err)
	}
	if attempts, _ := in.counts(); attempts != 1 || f.Hedges() != 0 {
		t.Errorf("%d attempts, Hedges() = %d; want 1 and 0: the hedge was due after the deadline", attempts, f.Hedges())
	}
}

// The engine writes an attempt's encoded sizes into the CallInfo it is
// given (kernel.CallInfo: "on the client both once next returns"), and
// filters before this one (prometheus's byte counters, a tracing span)
// read them from the caller's: a call that goes through the hedge, hedged
// or not, must hand the winner's sizes back as it hands its instance.
func TestCallerSeesTheWinnersSizes(t *testing.T) {
	f := build(t, nil)
	for _, delays := range [][]time.Duration{nil, {10 * time.Second}} {
		in := &instances{delays: delays}
		next := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
			resp, err := in.next(ctx, info, req)
			if err == nil {
				info.RequestSize, info.ResponseSize = 100+info.Attempt, 200+info.Attempt
			}
			return resp, err
		}
		info, resp, err := call(f, t.Context(), next)
		if err != nil {
			t.Fatal(err)
		}
		want := 1 // the attempt that answered
		if resp == "answer 2" {
			want = 2
		}
		if info.RequestSize != 100+want || info.ResponseSize != 200+want {
			t.Errorf("%v answered: the caller's info has sizes %d and %d, want the winner's, %d and %d",
				resp, info.RequestSize, info.ResponseSize, 100+want, 200+want)
		}
	}
}

// As no hedge is sent once the call's deadline has passed, no next
// attempt is started at once after a retryable failure that comes then
// (the engine's pick giving up at the deadline says Unavailable), though
// the call's context does not say it ended yet: the failure ends the
// call, and pays for nothing. The same on the path that sends no hedge
// (a method still too cold for an observed delay, or a budget that cannot
// pay for one).
func TestNoAttemptAfterAFailurePastTheCallsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{{"hedged", time.Hour}, {"unhedged", 0}} { // 0: cold, no delay yet
		t.Run(tc.name, func(t *testing.T) {
			f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(tc.delay) })
			unavailable := kernel.Errorf(kernel.Unavailable, "no instance before the deadline")
			in := &instances{delays: []time.Duration{100 * time.Millisecond}, errs: []error{unavailable}}
			done, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			ctx := lateCtx{done, time.Now().Add(50 * time.Millisecond)}
			before := f.Tokens()
			if _, _, err := call(f, ctx, in.next); err != unavailable {
				t.Errorf("err = %v, want the first attempt's %v", err, unavailable)
			}
			if attempts, _ := in.counts(); attempts != 1 || f.Hedges() != 0 {
				t.Errorf("%d attempts, Hedges() = %d; want 1 and 0: the failure came after the deadline", attempts, f.Hedges())
			}
			if after := f.Tokens(); after < before {
				t.Errorf("the budget went from %v to %v tokens for a failure past the deadline, which pays for no attempt", before, after)
			}
		})
	}
}
