package retry_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/retry"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, retry.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"backoff": "1ms"},
		BadOptions:    map[string]any{"max_attempts": 6},
		BadOptionsKey: "max_attempts",
	})
}

func TestBadOptionsAreNamed(t *testing.T) {
	for key, value := range map[string]any{
		"max_attempts":    0,
		"backoff":         "-1s",
		"max_backoff":     "1ms",
		"multiplier":      0.5,
		"jitter":          1.5,
		"retryable_codes": []any{"OK"},
		"non_idempotent":  []any{"Pay.*.Charge"},
		"budget":          map[string]any{"tokens": 0},
	} {
		_, err := retry.Factory.Build(map[string]any{key: value}, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), `option "`+key) {
			t.Errorf("%s: %v: err = %v, want one naming the option", key, value, err)
		}
	}
}

// clock is a fake time source for the budget's refill.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func build(t *testing.T, edit func(o *retry.Options)) *retry.Filter {
	t.Helper()
	o := retry.DefaultOptions()
	o.Backoff, o.MaxBackoff = 0, 0
	if edit != nil {
		edit(o)
	}
	f, err := retry.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f.(*retry.Filter)
}

// script is a next that answers with its errors in turn, then succeeds.
type script struct {
	mu    sync.Mutex
	errs  []error
	calls int
}

func (s *script) next(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return nil, err
	}
	return "ok", nil
}

func call(f *retry.Filter, ctx context.Context, method string, next kernel.Invoker) (any, error) {
	info := &kernel.CallInfo{Method: method, Side: kernel.ClientSide}
	return f.Invoke(ctx, info, "req", next)
}

var (
	unavailable = kernel.Errorf(kernel.Unavailable, "down")
	notFound    = kernel.Errorf(kernel.NotFound, "no such thing")
	neverSent   = &kernel.Status{Code: kernel.Unavailable, Retryable: true, Message: "never processed"}
	aborted     = kernel.Errorf(kernel.Aborted, "conflict")
	errPlain    = errors.New("not a status: Unknown")
)

func TestRetriesWhatItShouldAndNoMore(t *testing.T) {
	for _, tc := range []struct {
		name      string
		method    string
		errs      []error
		wantCalls int
		wantErr   error
	}{
		{"success", "Echo.Echo", nil, 1, nil},
		{"one Unavailable", "Echo.Echo", []error{unavailable}, 2, nil},
		{"another retryable code", "Echo.Echo", []error{aborted, unavailable}, 3, nil},
		{"up to max_attempts", "Echo.Echo", []error{unavailable, unavailable, unavailable, unavailable}, 3, unavailable},
		{"a code not listed", "Echo.Echo", []error{notFound}, 1, notFound},
		{"then a code not listed", "Echo.Echo", []error{unavailable, notFound}, 2, notFound},
		{"non-idempotent, processed", "Pay.Charge", []error{unavailable}, 1, unavailable},
		{"non-idempotent, never processed", "Pay.Charge", []error{neverSent}, 2, nil},
		{"non-idempotent, never processed then processed", "Pay.Charge", []error{neverSent, aborted}, 2, aborted},
		{"a plain error", "Echo.Echo", []error{errPlain}, 1, errPlain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A filter of its own: the cases would spend one budget.
			f := build(t, func(o *retry.Options) {
				o.NonIdempotent = []string{"Pay.*"}
				o.RetryableCodes = []kernel.Code{kernel.Unavailable, kernel.Aborted}
			})
			s := &script{errs: tc.errs}
			resp, err := call(f, t.Context(), tc.method, s.next)
			if err != tc.wantErr || (err == nil && resp != "ok") {
				t.Errorf("got (%v, %v), want error %v", resp, err, tc.wantErr)
			}
			if s.calls != tc.wantCalls {
				t.Errorf("%d attempts, want %d", s.calls, tc.wantCalls)
			}
		})
	}
}

func TestServerSidePassesThrough(t *testing.T) {
	f := build(t, nil)
	s := &script{errs: []error{unavailable}}
	info := &kernel.CallInfo{Method: "Echo.Echo", Side: kernel.ServerSide}
	if _, err := f.Invoke(t.Context(), info, "req", s.next); err != unavailable || s.calls != 1 {
		t.Errorf("server side: %v after %d calls of next, want the handler's error after one", err, s.calls)
	}
}

func TestNeverRetriesPastTheDeadline(t *testing.T) {
	f := build(t, func(o *retry.Options) {
		o.Backoff, o.MaxBackoff, o.Jitter = kernel.Duration(time.Second), kernel.Duration(time.Second), 0
	})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	s := &script{errs: []error{unavailable}}
	start := time.Now()
	if _, err := call(f, ctx, "Echo.Echo", s.next); err != unavailable || s.calls != 1 {
		t.Errorf("got %v after %d attempts; want the first error, no retry: the 1s wait outlasts the deadline", err, s.calls)
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("gave up after %v; want at once, not at the deadline", el)
	}

	// A wait the caller cancels ends the call with the last error.
	ctx, cancel = context.WithCancel(t.Context())
	time.AfterFunc(20*time.Millisecond, cancel)
	s = &script{errs: []error{unavailable}}
	if _, err := call(f, ctx, "Echo.Echo", s.next); err != unavailable || s.calls != 1 {
		t.Errorf("cancelled during the wait: %v after %d attempts; want the first error", err, s.calls)
	}
}

func TestBackoffGrowsWithJitter(t *testing.T) {
	f := build(t, func(o *retry.Options) {
		o.Backoff, o.MaxBackoff = kernel.Duration(10*time.Millisecond), kernel.Duration(35*time.Millisecond)
		o.MaxAttempts = 5
		o.Budget.Tokens = 100
	})
	s := &script{errs: []error{unavailable, unavailable, unavailable, unavailable}}
	start := time.Now()
	if _, err := call(f, t.Context(), "Echo.Echo", s.next); err != nil {
		t.Fatal(err)
	}
	// Waits of at most 10+20+35+35 ms, at least half that.
	if el := time.Since(start); el < 50*time.Millisecond || el > 2*time.Second {
		t.Errorf("four retries took %v; want between 50ms and 100ms (plus a loaded machine's slack)", el)
	}
}

// The budget, on an injected clock: a total outage spends it down to
// half, further failures are not retried, the refill over time lets a
// retry through again, and successes give tokens back.
func TestBudgetDrainsAndRefillsOnTheClock(t *testing.T) {
	clk := &clock{t: time.Unix(1_000_000, 0)}
	f := build(t, func(o *retry.Options) {
		o.MaxAttempts = 5
		o.Budget = retry.BudgetOptions{Tokens: 10, Refund: 0.5, RefillPerSecond: 1}
		o.Now = clk.Now
	})
	down := func(context.Context, *kernel.CallInfo, any) (any, error) { return nil, unavailable }
	attempts := 0
	counting := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		attempts++
		return down(ctx, info, req)
	}
	for range 100 {
		call(f, t.Context(), "Echo.Echo", counting)
	}
	if attempts != 100+4 {
		t.Errorf("100 calls in an outage made %d attempts, want 104: 4 retries leave the budget at half", attempts)
	}
	if got := f.Tokens(); got != 0 {
		t.Errorf("budget = %v tokens after the outage, want 0", got)
	}
	// Six seconds refill six tokens: one failure spends one, leaving five,
	// no more than half: still no retry. Seven leave six: one retry.
	clk.Advance(6 * time.Second)
	attempts = 0
	call(f, t.Context(), "Echo.Echo", counting)
	if attempts != 1 {
		t.Errorf("after 6s: %d attempts, want 1", attempts)
	}
	clk.Advance(2 * time.Second) // 5 + 2 = 7
	attempts = 0
	call(f, t.Context(), "Echo.Echo", counting)
	if attempts != 2 {
		t.Errorf("after 2s more: %d attempts, want 2 (7 → 6, retry → 5, stop)", attempts)
	}
	// Successes refund: 10 of them at 0.5 fill the budget.
	for range 10 {
		call(f, t.Context(), "Echo.Echo", (&script{}).next)
	}
	if got := f.Tokens(); got != 10 {
		t.Errorf("budget = %v after 10 successes refunding 0.5 from 5, want 10", got)
	}
}

// BenchmarkInvoke is the filter's cost per call: a trivial next, with and
// without the filter around it.
func BenchmarkInvoke(b *testing.B) {
	next := func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }
	info := &kernel.CallInfo{Method: "Echo.Echo", Side: kernel.ClientSide}
	ctx := context.Background()
	b.Run("without", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			next(ctx, info, "req")
		}
	})
	b.Run("with", func(b *testing.B) {
		f, err := retry.New(retry.DefaultOptions())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			f.Invoke(ctx, info, "req", next)
		}
	})
}
