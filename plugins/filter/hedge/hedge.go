// Package hedge is a client filter that, when a call has not answered
// after a delay, sends the same call to another instance and takes the
// first success, cancelling the others: a slow instance then costs a call
// the delay, not its whole slowness.
//
// Config name: "hedge". Options, with defaults:
//
//	filters:
//	  - name: hedge
//	    side: client
//	    options:
//	      max_attempts: 2        # attempts per call, the first included; 1 to 5
//	      delay: 0s              # wait before each hedge; 0: the method's observed percentile
//	      percentile: 95         # with delay 0: hedge calls slower than this share of the method's
//	      min_delay: 100us       # with delay 0: never hedge sooner than this
//	      retryable_codes: [Unavailable] # a failure with one of these starts the next attempt at once
//	      non_idempotent: []     # methods ("Pay.Charge", "Pay.*") never hedged
//	      budget:
//	        tokens: 10           # the budget's size; it starts full
//	        refund: 0.1          # what a successful call gives back
//	        refill_per_second: 1 # what comes back each second regardless
//
// With a delay of 0 the filter measures each method's attempt latencies
// (the last 1024 to 2048 of them, in buckets 12.5% wide) and hedges a call
// once it has taken longer than the percentile of them: by definition
// about 5% of calls at 95. A method is not hedged before 100 latencies
// were seen, nor sooner than min_delay. A fixed delay hedges every call
// slower than it. No hedge is sent once the call's deadline has passed,
// nor the next attempt after a failure that came once it had, which costs
// the budget nothing, hedged or not.
//
// Go's runtime timers fire up to a millisecond late in a process whose
// goroutines all wait, which would make a delay of 200µs one of 1.2ms.
// So on Linux a delay under 10ms runs on a timerfd of the filter's own,
// which the runtime's poller wakes for as soon as the kernel's timer
// fires (measured here: a median of 65µs late, against 1ms). The filter
// holds it from New to Close; a closed filter times its hedges with
// runtime timers.
//
// A failure with a code outside retryable_codes is final: the others are
// cancelled and the call returns it. One with such a code starts the next
// attempt at once instead of waiting for the delay. The call ends with the
// first success, or once every attempt failed, with the last failure.
// The caller gets the winning attempt's response metadata (and its
// instance and encoded sizes, for the filters before this one). An attempt
// that panics (a later filter, the codec, the balancer), on the caller's
// goroutine or a hedge's, decides the call: the others are cancelled and
// waited for, and the panic is raised again on the caller's goroutine,
// where a recover filter before this one makes it the call's error. One
// that panics after another attempt decided the call is logged at ERROR.
//
// The budget is the retry filter's algorithm: each hedge costs a token,
// and so does each failed attempt; each successful call gives back
// refund, and no hedge is sent unless the budget holds more than half its
// tokens once it is paid. Hedging then adds at most about refund extra
// attempts per call (10% by default), even when every instance is slow
// and a fixed delay would hedge every call, and stops within a few
// failures in an outage. The budget is shared with a retry filter on the
// same client: the filter is a kernel.AttemptBudgetOwner, and the client's
// retry and hedge filters spend from the budget of the first of them in
// the config, whose budget options apply (those of the others then do
// not), so that retries and hedges together stay within one budget; on a
// method both serve, a failed attempt costs it one token and a successful
// call gives back one refund, not one for each filter that sees them. The
// hedge already sends its next attempt at once after a retryable failure,
// which is a retry: rather than stacking the two on one method, give each
// its methods (filters' methods: key).
//
// Each concurrent attempt gets a CallInfo of its own and, if the call
// carries request metadata, a copy of it taken before the first attempt,
// so that filters after this one may add metadata to their attempt. Keep
// non-idempotent methods out (non_idempotent): two servers may both
// process a hedged call. The filter declares the call stage, where each
// call of next is a fresh pick, and the client side (kernel.SidedFilter):
// an entry with no side leaves servers without it, and one with side:
// server is a config error. Called on a server all the same, it passes
// calls through.
package hedge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/internal/retrybudget"
	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "hedge"

// MaxAttemptsCap is the most attempts per call max_attempts may allow.
const MaxAttemptsCap = 5

// BudgetOptions configure the hedge budget, under the key "budget".
type BudgetOptions = retrybudget.Options

// Options configure the filter.
type Options struct {
	// MaxAttempts is the most attempts per call, the first included: 1
	// (no hedge) to MaxAttemptsCap.
	MaxAttempts int `json:"max_attempts"`
	// Delay is how long an attempt runs before the next starts; 0 means
	// the method's observed Percentile.
	Delay kernel.Duration `json:"delay"`
	// Percentile, above 0 and below 100, picks the observed delay.
	Percentile float64 `json:"percentile"`
	// MinDelay is the shortest observed delay used: hedging sooner than
	// this costs a hedge for a gain a timer cannot deliver.
	MinDelay kernel.Duration `json:"min_delay"`
	// RetryableCodes are the failures after which the next attempt starts
	// at once; any other failure ends the call.
	RetryableCodes []kernel.Code `json:"retryable_codes"`
	// NonIdempotent lists methods never hedged; a trailing * matches a
	// prefix.
	NonIdempotent []string `json:"non_idempotent"`
	// Budget bounds hedges as a whole.
	Budget BudgetOptions `json:"budget"`

	// Logger receives hedges refused by the budget, at debug level; nil:
	// slog.Default().
	Logger *slog.Logger `json:"-"`
	// Now is the budget's clock; nil: time.Now. Tests inject one.
	Now func() time.Time `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{
		MaxAttempts:    2,
		Percentile:     95,
		MinDelay:       kernel.Duration(100 * time.Microsecond),
		RetryableCodes: []kernel.Code{kernel.Unavailable},
		NonIdempotent:  []string{},
		Budget:         retrybudget.DefaultOptions(),
	}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "client: sends a slow call to another instance too and takes the first success", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from decoded options, naming the first bad one.
func New(o *Options) (kernel.Filter, error) {
	switch {
	case o.MaxAttempts < 1 || o.MaxAttempts > MaxAttemptsCap:
		return nil, fmt.Errorf(`%s: option "max_attempts": %d; want 1 to %d`, Name, o.MaxAttempts, MaxAttemptsCap)
	case o.Delay < 0:
		return nil, fmt.Errorf(`%s: option "delay": %s must not be negative`, Name, o.Delay)
	case !(o.Percentile > 0 && o.Percentile < 100):
		return nil, fmt.Errorf(`%s: option "percentile": %v; want above 0 and below 100`, Name, o.Percentile)
	case o.MinDelay < 0:
		return nil, fmt.Errorf(`%s: option "min_delay": %s must not be negative`, Name, o.MinDelay)
	}
	for _, c := range o.RetryableCodes {
		if c == kernel.OK {
			return nil, fmt.Errorf(`%s: option "retryable_codes": OK is no failure`, Name)
		}
	}
	for i, m := range o.NonIdempotent {
		if err := kernel.CheckMethodPattern(m); err != nil {
			return nil, fmt.Errorf(`%s: option "non_idempotent": entry %d (%q) %v`, Name, i, m, err)
		}
	}
	budget, err := retrybudget.New(o.Budget, o.Now)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	f := &Filter{
		maxAttempts:   o.MaxAttempts,
		delay:         o.Delay.D(),
		minDelay:      o.MinDelay.D(),
		nonIdempotent: slices.Clone(o.NonIdempotent),
		own:           budget,
		budget:        budget,
		log:           o.Logger,
	}
	if f.delay == 0 {
		f.trackers = newTrackers(o.Percentile / 100)
	}
	for _, c := range o.RetryableCodes {
		if int(c) < len(f.codes) {
			f.codes[c] = true
		}
	}
	if f.log == nil {
		f.log = slog.Default()
	}
	f.calls.New = func() any { return f.newCall() }
	if f.delay < preciseBelow {
		f.clock = newClock()
	}
	return f, nil
}

// Filter hedges calls; one value serves every call of a client.
type Filter struct {
	maxAttempts   int
	delay         time.Duration // fixed; 0: from trackers
	minDelay      time.Duration // the shortest from trackers
	trackers      *trackers
	codes         [kernel.Unauthenticated + 1]bool
	nonIdempotent []string
	own           *retrybudget.Budget
	budget        kernel.AttemptBudget // own, or the one it shares (ObservePlugins)
	// Another budget-keeping filter of the client comes before this one
	// (reports: it may run this one, which tells it what it charged) or
	// after it (wraps: it may run in this one's attempts).
	reports, wraps bool
	log            *slog.Logger
	calls          sync.Pool // *call whose timer never fired
	clock          *clock    // precise timer for short delays; nil: none
	hedges         atomic.Int64
	unpaid         atomic.Int64
}

var (
	_ kernel.Filter             = (*Filter)(nil)
	_ kernel.StagedFilter       = (*Filter)(nil)
	_ kernel.SidedFilter        = (*Filter)(nil)
	_ kernel.AttemptBudgetOwner = (*Filter)(nil)
	_ kernel.PluginsObserver    = (*Filter)(nil)
	_ io.Closer                 = (*Filter)(nil)
)

// Close stops the precise clock, if the filter has one; calls still
// waiting on it are not hedged, and later calls use runtime timers.
func (f *Filter) Close() error {
	if f.clock == nil {
		return nil
	}
	return f.clock.close()
}

// Stage is the call stage: each call of next there is a fresh pick.
func (*Filter) Stage() kernel.Stage { return kernel.CallStage }

// Side keeps the filter to clients, the side that picks instances.
func (*Filter) Side() kernel.Side { return kernel.ClientSide }

// AttemptBudget is the filter's own budget, which the client's other
// budget-keeping filters after it in the config share.
func (f *Filter) AttemptBudget() kernel.AttemptBudget { return f.own }

// ObservePlugins makes the filter spend from the budget of the first
// budget-keeping filter of its client (its own if it is the first), so
// that a client's retries and hedges together stay within one budget.
func (f *Filter) ObservePlugins(refs []kernel.PluginRef) {
	f.budget = retrybudget.Shared(f.own, refs)
	f.reports, f.wraps = retrybudget.Around(f, refs)
}

// outer is the budget-keeping filter's Nested this one runs in, if any.
func (f *Filter) outer(ctx context.Context) *retrybudget.Nested {
	if !f.reports {
		return nil
	}
	return retrybudget.Outer(ctx)
}

// nested is the context of an attempt under ctx: with another
// budget-keeping filter after this one, which may run in it, a
// retrybudget.Nested, in which that filter says what it charged.
func (f *Filter) nested(ctx context.Context) (context.Context, *retrybudget.Nested) {
	if !f.wraps {
		return ctx, nil
	}
	n := retrybudget.NewNested(ctx)
	return n, n
}

// Hedges reports how many attempts beyond each call's first the filter
// has started.
func (f *Filter) Hedges() int64 { return f.hedges.Load() }

// Unpaid reports how many hedges the budget refused: calls that were, or
// would have been, slow enough to hedge when it held too few tokens.
func (f *Filter) Unpaid() int64 { return f.unpaid.Load() }

// Tokens reports what the budget the filter spends from holds now.
func (f *Filter) Tokens() float64 { return f.budget.Tokens() }

// Delay reports the delay after which a call of method is hedged now: the
// fixed one, or the method's observed percentile (0 while too few
// latencies were seen).
func (f *Filter) Delay(method string) time.Duration {
	if f.trackers == nil {
		return f.delay
	}
	return f.observed(f.trackers.forMethod(method))
}

// observed is tr's delay, no shorter than min_delay; 0 while tr is cold.
func (f *Filter) observed(tr *tracker) time.Duration {
	d := tr.Delay()
	if d > 0 && d < f.minDelay {
		return f.minDelay
	}
	return d
}

// Invoke makes the first attempt and, if it is slow or fails, the others.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side != kernel.ClientSide || f.maxAttempts < 2 || ctx.Err() != nil || f.matches(info.Method) {
		return next(ctx, info, req)
	}
	var tr *tracker
	delay := f.delay
	if f.trackers != nil {
		tr = f.trackers.forMethod(info.Method)
		delay = f.observed(tr)
	}
	if delay <= 0 {
		return f.single(ctx, info, req, next, tr, 0)
	}
	if !f.budget.CanSpend() {
		return f.single(ctx, info, req, next, tr, delay)
	}
	return f.hedged(ctx, info, req, next, tr, delay)
}

// single makes the call's only attempt: it is not to be hedged, for want
// of a delay or, if unpaid is not 0, of budget (and then it counts as
// unpaid if it took longer than that).
func (f *Filter) single(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker, tr *tracker, unpaid time.Duration) (any, error) {
	start := time.Now()
	actx, n := f.nested(ctx)
	resp, err := next(actx, info, req)
	elapsed := time.Since(start)
	if tr != nil {
		tr.observe(elapsed)
	}
	if unpaid > 0 && elapsed > unpaid {
		f.unpaid.Add(1)
	}
	out := f.outer(ctx)
	switch {
	case err == nil:
		n.Succeeded(f.budget)
		out.Report(false, false, true)
	case ctx.Err() == nil && !pastDeadline(ctx) && f.retryable(err):
		// A failure once the deadline passed (which ctx may not say
		// yet, see pastDeadline) ends the call, as when ctx ended: it is
		// charged no more than in a hedged call.
		out.Report(true, n.Failed(f.budget), false)
	default:
		n.Pass(out)
	}
	return resp, err
}

func (f *Filter) retryable(err error) bool {
	c := kernel.CodeOf(err)
	return int(c) < len(f.codes) && f.codes[c]
}

// matches reports whether method is listed in non_idempotent.
func (f *Filter) matches(method string) bool {
	for _, m := range f.nonIdempotent {
		if kernel.MatchMethod(m, method) {
			return true
		}
	}
	return false
}

func (f *Filter) debug(ctx context.Context, msg string, method string, attempt int) {
	if !f.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	f.log.LogAttrs(ctx, slog.LevelDebug, Name+": "+msg, slog.String("method", method), slog.Int("attempt", attempt),
		slog.Float64("budget_tokens", f.budget.Tokens()))
}
