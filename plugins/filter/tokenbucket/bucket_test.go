package tokenbucket

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// rig is a filter on a clock the test moves; its sleep advances the clock
// by what it was asked to wait, or fails with sleepErr.
type rig struct {
	t        *testing.T
	f        *Filter
	clock    time.Duration
	slept    []time.Duration
	sleepErr error
	calls    int
}

func newRig(t *testing.T, opts map[string]any) *rig {
	t.Helper()
	flt, err := Factory.Build(opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, f: flt.(*Filter)}
	r.f.now = func() int64 { return int64(r.clock) }
	r.f.sleep = func(_ context.Context, d time.Duration) error {
		r.slept = append(r.slept, d)
		if r.sleepErr != nil {
			return r.sleepErr
		}
		r.clock += d
		return nil
	}
	return r
}

// call makes one client call of method, returning its response metadata
// and error.
func (r *rig) call(ctx context.Context, method string) (kernel.Metadata, error) {
	info := &kernel.CallInfo{Method: method, Side: kernel.ClientSide}
	_, err := r.f.Invoke(ctx, info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
		r.calls++
		return "ok", nil
	})
	return info.ResponseMetadata, err
}

// passes asserts that n calls in a row pass at the current time.
func (r *rig) passes(n int, method string) {
	r.t.Helper()
	for i := range n {
		if _, err := r.call(context.Background(), method); err != nil {
			r.t.Fatalf("at %v, call %d of %d: %v", r.clock, i+1, n, err)
		}
	}
}

// rejected asserts that a call is rejected now, telling to come back after
// retryAfter milliseconds.
func (r *rig) rejected(method string, retryAfter int) error {
	r.t.Helper()
	before := r.calls
	md, err := r.call(context.Background(), method)
	if kernel.CodeOf(err) != kernel.ResourceExhausted || r.calls != before {
		r.t.Fatalf("at %v: %v (next called: %v), want ResourceExhausted without calling next", r.clock, err, r.calls != before)
	}
	if got := md[RetryAfterKey]; got != strconv.Itoa(retryAfter) {
		r.t.Errorf("at %v: %s = %q, want %d", r.clock, RetryAfterKey, got, retryAfter)
	}
	if want := "retry after " + strconv.Itoa(retryAfter) + "ms"; !strings.Contains(err.Error(), want) {
		r.t.Errorf("at %v: %q does not say %q", r.clock, err, want)
	}
	return err
}

func TestBurstThenRefill(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 3})
	r.passes(3, "Echo.Who")
	err := r.rejected("Echo.Who", 100)
	for _, want := range []string{"token-bucket: Echo.Who is over its rate limit (10/s, burst 3, shared by every method)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	r.clock += 40 * time.Millisecond
	r.rejected("Echo.Who", 60)
	r.clock += 59*time.Millisecond + 500*time.Microsecond
	r.rejected("Echo.Who", 1) // 0.5ms rounds up to 1
	r.clock += 500 * time.Microsecond
	r.passes(1, "Echo.Who")
	r.rejected("Echo.Who", 100)
	// A long quiet refills the bucket up to burst, no more.
	r.clock += time.Hour
	r.passes(3, "Echo.Who")
	r.rejected("Echo.Who", 100)
	// A steady 10/s passes forever.
	for range 50 {
		r.clock += 100 * time.Millisecond
		r.passes(1, "Echo.Who")
	}
}

func TestFractionalRate(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 0.5, "burst": 1})
	r.passes(1, "Echo.Who")
	r.rejected("Echo.Who", 2000)
	r.clock += 2 * time.Second
	r.passes(1, "Echo.Who")
}

func TestScopes(t *testing.T) {
	g := newRig(t, map[string]any{"rate": 1, "burst": 2})
	g.passes(1, "Echo.A")
	g.passes(1, "Echo.B")
	g.rejected("Echo.C", 1000)

	m := newRig(t, map[string]any{"rate": 1, "burst": 2, "scope": "method"})
	m.passes(2, "Echo.A")
	m.passes(2, "Echo.B")
	err := m.rejected("Echo.A", 1000)
	if !strings.Contains(err.Error(), "per method") {
		t.Errorf("%q does not say the limit is per method", err)
	}
}

func TestPerMethodBucketsAreBounded(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 1, "burst": 1, "scope": "method"})
	for i := range maxBuckets {
		r.passes(1, "M"+strconv.Itoa(i))
	}
	r.passes(1, "past-the-bound-1") // the overflow bucket's one token
	r.rejected("past-the-bound-2", 1000)
	if n := len(*r.f.perMethod.m.Load()); n != maxBuckets {
		t.Errorf("%d buckets, want %d", n, maxBuckets)
	}
}

func TestBackoffWaitsForTheNextToken(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 1, "mode": "backoff", "max_wait": "150ms"})
	r.passes(1, "Echo.Who")
	r.passes(1, "Echo.Who") // waits 100ms
	if len(r.slept) != 1 || r.slept[0] != 100*time.Millisecond {
		t.Fatalf("slept %v, want one wait of 100ms", r.slept)
	}
	// Two calls at once: the first reserves the token 100ms away, the
	// second the one 200ms away, past max_wait: rejected at once.
	r.slept = nil
	r.f.sleep = func(context.Context, time.Duration) error { return nil } // leave the clock
	r.passes(1, "Echo.Who")
	err := r.rejected("Echo.Who", 200)
	if !strings.Contains(err.Error(), "after max_wait (150ms) or the call's deadline") {
		t.Errorf("%q does not say why it did not wait", err)
	}
}

func TestBackoffNeverWaitsPastTheDeadline(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 1, "mode": "backoff", "max_wait": "1s"})
	r.passes(1, "Echo.Who")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	md, err := r.call(ctx, "Echo.Who")
	if kernel.CodeOf(err) != kernel.ResourceExhausted || len(r.slept) != 0 || md[RetryAfterKey] != "100" {
		t.Fatalf("a token 100ms away, a deadline in 30ms: %v, slept %v, md %v; want a rejection at once", err, r.slept, md)
	}
	// With a deadline far enough, it waits.
	ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if _, err := r.call(ctx, "Echo.Who"); err != nil || len(r.slept) != 1 {
		t.Fatalf("a deadline in an hour: %v, slept %v", err, r.slept)
	}
}

func TestCancelledWhileWaitingGivesTheTokenBack(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 1, "mode": "backoff", "max_wait": "1s"})
	r.passes(1, "Echo.Who")
	r.sleepErr = context.Canceled
	_, err := r.call(context.Background(), "Echo.Who")
	if kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "ended while it waited 100ms for a token") {
		t.Fatalf("cancelled while waiting: %v", err)
	}
	r.sleepErr = nil
	r.slept = nil
	r.passes(1, "Echo.Who")
	if len(r.slept) != 1 || r.slept[0] != 100*time.Millisecond {
		t.Errorf("the next call waited %v; want 100ms, the token the cancelled call gave back", r.slept)
	}
}

func TestConcurrentTakersGetExactlyBurst(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 1, "burst": 100})
	var passed atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
				if r.f.Admit(context.Background(), info) == nil {
					passed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := passed.Load(); n != 100 {
		t.Errorf("%d of 400 calls at one instant passed, want the burst, 100", n)
	}
}

func TestServerTakesItsTokenInAdmit(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 1, "burst": 1})
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "10.0.0.1:5000"}
	if err := r.f.Admit(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	info = &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "10.0.0.1:5000"}
	err := r.f.Admit(context.Background(), info)
	if kernel.CodeOf(err) != kernel.ResourceExhausted || info.ResponseMetadata[RetryAfterKey] != "1000" {
		t.Fatalf("second Admit: %v, md %v", err, info.ResponseMetadata)
	}
	// Invoke on the server passes through: the engine already asked Admit.
	if _, err := r.f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }); err != nil {
		t.Errorf("server-side Invoke: %v", err)
	}
}

func TestBadOptions(t *testing.T) {
	for want, opts := range map[string]map[string]any{
		`option "rate"`:     {"rate": 0},
		`option "burst"`:    {"burst": 0},
		`option "scope"`:    {"scope": "host"},
		`option "mode"`:     {"mode": "queue"},
		`option "max_wait"`: {"mode": "backoff", "max_wait": "0s"},
	} {
		_, err := Factory.Build(opts, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("options %v: %v, want an error saying %s", opts, err, want)
		}
	}
	if _, err := Factory.Build(map[string]any{"rate": 2e9}, "svc.yaml"); err == nil {
		t.Error("a rate above one token per nanosecond was accepted")
	}
}

// A negative max_wait means nothing in any mode: it is refused in mode
// reject too, where max_wait is not used, as other filters refuse a
// negative duration whatever their other options.
func TestNegativeMaxWaitIsRefusedInEveryMode(t *testing.T) {
	for _, mode := range []string{ModeReject, ModeBackoff} {
		_, err := Factory.Build(map[string]any{"mode": mode, "max_wait": "-1s"}, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), `option "max_wait"`) {
			t.Errorf("mode %s, max_wait -1s: %v, want an error naming the option", mode, err)
		}
	}
}
