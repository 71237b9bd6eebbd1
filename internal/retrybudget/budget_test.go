package retrybudget

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a fake time source: it moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newBudget(t *testing.T, o Options) (*Budget, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1_000_000, 0)}
	b, err := New(o, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return b, c
}

// During a total outage every attempt fails: a budget of 10 lets
// exactly 5 retries through, whatever the number of calls.
func TestOutageAllowsHalfTheTokensInRetries(t *testing.T) {
	b, _ := newBudget(t, Options{Tokens: 10, Refund: 0.1})
	retries := 0
	for range 1000 { // calls, each retried while allowed, at most 4 times
		for attempt := 1; attempt <= 5; attempt++ {
			if !b.Failed() || attempt == 5 {
				break
			}
			retries++
		}
	}
	if retries != 4 {
		// 10 → 9 (retry) → 8 → 7 → 6 (retry each) → 5: no more.
		t.Errorf("retries = %d over 1000 failed calls, want 4 (the failures that leave more than 5 tokens)", retries)
	}
	if got := b.Tokens(); got != 0 {
		t.Errorf("tokens = %v after the outage, want 0", got)
	}
}

func TestSuccessesRefundUpToTheTop(t *testing.T) {
	b, _ := newBudget(t, Options{Tokens: 10, Refund: 0.1})
	for range 10 {
		b.Failed()
	}
	if b.Failed() {
		t.Fatal("an empty budget allowed a retry")
	}
	for range 50 {
		b.Succeeded()
	}
	if got := b.Tokens(); got != 5 {
		t.Fatalf("tokens = %v after 50 refunds of 0.1, want 5", got)
	}
	if b.CanSpend() {
		t.Error("a budget at half its tokens allows an extra attempt")
	}
	for range 11 {
		b.Succeeded()
	}
	if !b.CanSpend() || !b.Spend() {
		t.Error("a budget of 6.1 refuses to spend a token")
	}
	if b.Spend() {
		t.Error("a budget of 5.1 spent a token, leaving it below half")
	}
	for range 1000 {
		b.Succeeded()
	}
	if got := b.Tokens(); got != 10 {
		t.Errorf("tokens = %v after many refunds, want the top, 10", got)
	}
}

func TestRefillFollowsTheClock(t *testing.T) {
	b, c := newBudget(t, Options{Tokens: 10, Refund: 0, RefillPerSecond: 2})
	for range 10 {
		b.Failed()
	}
	if got := b.Tokens(); got != 0 {
		t.Fatalf("tokens = %v, want 0", got)
	}
	c.advance(1500 * time.Millisecond)
	if got := b.Tokens(); got != 3 {
		t.Errorf("tokens = %v after 1.5s at 2/s, want 3", got)
	}
	// Many small steps add up: no rounding lost at each read.
	for range 1000 {
		c.advance(100 * time.Microsecond)
		b.Tokens()
	}
	if got := b.Tokens(); got != 3.2 {
		t.Errorf("tokens = %v after 1000 steps of 100µs more, want 3.2", got)
	}
	c.advance(3 * time.Second)
	if !b.Spend() {
		t.Error("a budget of 9.2 refuses to spend")
	}
	c.advance(time.Hour)
	if got := b.Tokens(); got != 10 {
		t.Errorf("tokens = %v after an hour, want the top, 10", got)
	}
	c.advance(-time.Minute) // a clock stepping back refills nothing
	b.Failed()
	if got := b.Tokens(); got != 9 {
		t.Errorf("tokens = %v, want 9", got)
	}
}

// Many callers failing at once never overdraw the budget: each decision
// is made on the state its own charge left.
func TestConcurrentFailuresAllowNoMoreThanSequentialOnes(t *testing.T) {
	b, _ := newBudget(t, Options{Tokens: 10})
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				if b.Failed() {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if allowed != 4 {
		t.Errorf("%d failures were allowed a retry, want 4", allowed)
	}
}

func TestValidateNamesTheOption(t *testing.T) {
	for o, key := range map[Options]string{
		{Tokens: 0.5}:                                   "budget.tokens",
		{Tokens: 10, Refund: -1}:                        "budget.refund",
		{Tokens: 10, Refund: 11}:                        "budget.refund",
		{Tokens: 10, RefillPerSecond: -0.1}:             "budget.refill_per_second",
		{Tokens: 2e6}:                                   "budget.tokens",
		{Tokens: 10, Refund: 0.1, RefillPerSecond: 2e6}: "budget.refill_per_second",
		// Below the budget's thousandth of a token, which would count 0.
		{Tokens: 10, Refund: 0.0004}:                     "budget.refund",
		{Tokens: 10, Refund: 0.1, RefillPerSecond: 1e-4}: "budget.refill_per_second",
	} {
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), `"`+key+`"`) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", o, err, key)
		}
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func BenchmarkSucceeded(b *testing.B) {
	bud, _ := New(DefaultOptions(), nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bud.Succeeded()
		}
	})
}
