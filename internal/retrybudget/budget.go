// Package retrybudget is the token budget the retry and hedge filters
// spend extra attempts from, so that retries and hedges cannot multiply an
// outage. It is gRPC's retry throttling with a slow refill over time:
//
//   - the budget holds up to Tokens tokens and starts full;
//   - each failed attempt costs one token (never below zero);
//   - each successful call gives back Refund tokens;
//   - RefillPerSecond tokens come back each second whatever happens, so
//     that a client calling too rarely to earn refunds recovers too;
//   - an extra attempt is allowed only while the budget holds more than
//     half its tokens.
//
// During a total outage every attempt fails, the budget falls to half its
// tokens within Tokens/2 failures and stays there: no more than Tokens/2
// extra attempts (plus what the refill adds) reach the servers, however
// many calls are made. Tokens are counted in thousandths, atomically: a
// success costs one compare-and-swap at most and never reads the clock.
package retrybudget

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Options configure a budget, under the key "budget" of the filters that
// use one.
type Options struct {
	// Tokens is the budget's size; it starts full. At least 1.
	Tokens float64 `json:"tokens"`
	// Refund is what a successful call gives back: 0, or between 0.001 (the
	// budget counts thousandths of a token) and Tokens.
	Refund float64 `json:"refund"`
	// RefillPerSecond is what comes back each second regardless; 0: none,
	// else at least 0.001.
	RefillPerSecond float64 `json:"refill_per_second"`
}

// DefaultOptions is a budget of 10 tokens, a tenth of a token back per
// success and one token a second.
func DefaultOptions() Options {
	return Options{Tokens: 10, Refund: 0.1, RefillPerSecond: 1}
}

// Validate names the first bad option, as budget.<key>.
func (o Options) Validate() error {
	switch {
	case !(o.Tokens >= 1) || o.Tokens > 1e6:
		return fmt.Errorf(`option "budget.tokens": %v; want at least 1 (and at most 1e6)`, o.Tokens)
	case !(o.Refund >= 0) || o.Refund > o.Tokens || tooFine(o.Refund):
		return fmt.Errorf(`option "budget.refund": %v; want 0, or between 0.001 and budget.tokens (%v)`, o.Refund, o.Tokens)
	case !(o.RefillPerSecond >= 0) || o.RefillPerSecond > 1e6 || tooFine(o.RefillPerSecond):
		return fmt.Errorf(`option "budget.refill_per_second": %v; want 0, or between 0.001 and 1e6`, o.RefillPerSecond)
	}
	return nil
}

// tooFine reports whether v, not 0, rounds to no thousandth of a token:
// the budget would silently use 0.
func tooFine(v float64) bool { return v != 0 && math.Round(v*milli) == 0 }

// milli is the fixed-point unit: a token is 1000 of them.
const milli = 1000

// Budget is safe for concurrent use.
type Budget struct {
	max, half, refund int64 // in thousandths of a token
	perSecond         int64 // refill, in thousandths of a token per second
	fillTime          int64 // ns the refill takes from empty to full
	now               func() time.Time
	base              time.Time

	tokens atomic.Int64 // thousandths of a token
	last   atomic.Int64 // ns since base of the last refill
}

// New builds a budget from validated options; now is its clock (nil:
// time.Now), injected by tests of the refill.
func New(o Options, now func() time.Time) (*Budget, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	b := &Budget{
		max:       int64(math.Round(o.Tokens * milli)),
		refund:    int64(math.Round(o.Refund * milli)),
		perSecond: int64(math.Round(o.RefillPerSecond * milli)),
		now:       now,
		base:      now(),
	}
	b.half = b.max / 2
	if b.perSecond > 0 {
		b.fillTime = b.max * int64(time.Second) / b.perSecond
	}
	b.tokens.Store(b.max)
	return b, nil
}

// Tokens reports the tokens the budget holds now, refill included.
func (b *Budget) Tokens() float64 {
	b.refill()
	return float64(b.tokens.Load()) / milli
}

// Succeeded gives back the refund for a successful call.
func (b *Budget) Succeeded() {
	if b.refund == 0 {
		return
	}
	for {
		v := b.tokens.Load()
		if v >= b.max {
			return
		}
		if b.tokens.CompareAndSwap(v, min(v+b.refund, b.max)) {
			return
		}
	}
}

// Failed charges one token for a failed attempt and reports whether
// another attempt may follow: whether, once charged, the budget still
// holds more than half its tokens. Charging and deciding are one atomic
// step, so that callers failing at once cannot overdraw it together.
func (b *Budget) Failed() (retry bool) {
	b.refill()
	for {
		v := b.tokens.Load()
		n := max(v-milli, 0)
		if b.tokens.CompareAndSwap(v, n) {
			return n > b.half
		}
	}
}

// Spend takes one token for an extra attempt that no failure paid for (a
// hedge), if the budget holds more than half its tokens once it is taken.
func (b *Budget) Spend() bool {
	b.refill()
	for {
		v := b.tokens.Load()
		if v-milli <= b.half {
			return false
		}
		if b.tokens.CompareAndSwap(v, v-milli) {
			return true
		}
	}
}

// CanSpend reports whether Spend would succeed now, without spending.
func (b *Budget) CanSpend() bool {
	b.refill()
	return b.tokens.Load()-milli > b.half
}

// refill adds what the time since the last refill earned. Only a whole
// thousandth moves the clock on, so that frequent calls do not round the
// refill away.
func (b *Budget) refill() {
	if b.perSecond == 0 {
		return
	}
	now := int64(b.now().Sub(b.base))
	last := b.last.Load()
	elapsed := now - last
	if elapsed <= 0 {
		return
	}
	var add int64
	to := now
	if elapsed >= b.fillTime {
		add = b.max // guards the multiplication below against overflow
	} else {
		add = elapsed * b.perSecond / int64(time.Second)
		// The clock moves on by what the whole thousandths took, not to
		// now: the remainder is kept for the next refill.
		to = last + (add*int64(time.Second)+b.perSecond-1)/b.perSecond
	}
	if add == 0 || !b.last.CompareAndSwap(last, to) {
		return
	}
	for {
		v := b.tokens.Load()
		if v >= b.max || b.tokens.CompareAndSwap(v, min(v+add, b.max)) {
			return
		}
	}
}

var _ kernel.AttemptBudget = (*Budget)(nil)

// Shared is the budget a filter whose own is own spends from, given the
// plugins of its client: that of the first AttemptBudgetOwner among them,
// in config order, so that every budget-keeping filter of a client spends
// from one budget.
func Shared(own kernel.AttemptBudget, refs []kernel.PluginRef) kernel.AttemptBudget {
	for _, r := range refs {
		if o, ok := r.Plugin.(kernel.AttemptBudgetOwner); ok && r.Kind == kernel.KindFilter && r.Side == kernel.ClientSide {
			return o.AttemptBudget()
		}
	}
	return own
}
