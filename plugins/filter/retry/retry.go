// Package retry is a client filter that sends a failed call again, to a
// fresh pick each time, with exponential backoff and jitter, within a
// retry budget so that retries cannot multiply an outage.
//
// Config name: "retry". Options, with defaults:
//
//	filters:
//	  - name: retry
//	    side: client
//	    options:
//	      max_attempts: 3          # attempts per call, the first included; 1 to 5
//	      backoff: 25ms            # the wait before the first retry
//	      max_backoff: 1s          # the longest wait
//	      multiplier: 2            # each wait is this many times the one before
//	      jitter: 0.5              # waits are drawn from [w×(1−jitter), w]; 0 to 1
//	      retryable_codes: [Unavailable] # the codes a call is retried after
//	      non_idempotent: []       # methods ("Pay.Charge", "Pay.*") retried only when never processed
//	      budget:
//	        tokens: 10             # the budget's size; it starts full
//	        refund: 0.1            # what a successful call gives back
//	        refill_per_second: 1   # what comes back each second regardless
//
// A call is retried when its error has one of retryable_codes, or when the
// engine marks it Retryable in its *kernel.Status (the request provably
// never reached a server, or the server refused it unprocessed): a method
// listed in non_idempotent is retried only then, since a server may have
// acted on it otherwise. A call is never retried after its context ended,
// nor when the wait would outlast its deadline. The call's last error is
// returned as it was, code and all.
//
// The budget: each failed attempt (with a retryable error) costs a token,
// each successful call gives back refund, and a retry is sent only while
// the budget holds more than half its tokens once the failure is charged.
// During a total outage at most tokens/2 retries (plus the refill) reach
// the servers, however many calls are made. In steady state retries run at
// most at about refund per call: the default tenth tolerates one call in
// ten failing, and a higher share of failures drains the budget and stops
// the retries; raise refund where a larger share of instances may fail
// while the others stay healthy. Each client has one budget for all its
// extra attempts: the filter is a kernel.AttemptBudgetOwner, and the
// client's retry and hedge filters spend from the budget of the first of
// them in the config, whose budget options apply (those of the others
// then do not). A client with only this filter spends from its own. On a
// method both serve, the one later in the config runs in the other's
// calls of next and tells it what it charged or refunded, so that a
// failed attempt costs one token and a successful call gives back one
// refund, not one for each filter that sees them.
//
// The filter belongs in the call stage (it declares it): each call of next
// there is an attempt with a pick of its own, and the client side
// (kernel.SidedFilter): an entry with no side leaves servers without it,
// and one with side: server is a config error. Called on a server all the
// same, it passes calls through. The engine itself also resends calls the
// server did not process, up to client.retries times, inside each attempt;
// this filter's attempts come on top of those.
package retry

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kernrpc/kernrpc/internal/retrybudget"
	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "retry"

// MaxAttemptsCap is the most attempts per call max_attempts may allow.
const MaxAttemptsCap = 5

// BudgetOptions configure the retry budget, under the key "budget".
type BudgetOptions = retrybudget.Options

// Options configure the filter.
type Options struct {
	// MaxAttempts is the most attempts per call, the first included: 1
	// (no retry) to MaxAttemptsCap.
	MaxAttempts int `json:"max_attempts"`
	// Backoff is the wait before the first retry; each later one is
	// Multiplier times the one before, up to MaxBackoff.
	Backoff    kernel.Duration `json:"backoff"`
	MaxBackoff kernel.Duration `json:"max_backoff"`
	Multiplier float64         `json:"multiplier"`
	// Jitter spreads the waits: each is drawn uniformly from
	// [w×(1−Jitter), w], so that clients failing together do not retry
	// together. 0 to 1.
	Jitter float64 `json:"jitter"`
	// RetryableCodes are the codes after which a call is sent again.
	RetryableCodes []kernel.Code `json:"retryable_codes"`
	// NonIdempotent lists methods that are retried only when the engine
	// says the server never processed the call; a trailing * matches a
	// prefix.
	NonIdempotent []string `json:"non_idempotent"`
	// Budget bounds retries as a whole.
	Budget BudgetOptions `json:"budget"`

	// Logger receives the retries, at debug level; nil: slog.Default().
	Logger *slog.Logger `json:"-"`
	// Now is the budget's clock; nil: time.Now. Tests inject one.
	Now func() time.Time `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{
		MaxAttempts:    3,
		Backoff:        kernel.Duration(25 * time.Millisecond),
		MaxBackoff:     kernel.Duration(time.Second),
		Multiplier:     2,
		Jitter:         0.5,
		RetryableCodes: []kernel.Code{kernel.Unavailable},
		NonIdempotent:  []string{},
		Budget:         retrybudget.DefaultOptions(),
	}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "client: retries failed calls with backoff, within a retry budget", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from decoded options, naming the first bad one.
func New(o *Options) (kernel.Filter, error) {
	switch {
	case o.MaxAttempts < 1 || o.MaxAttempts > MaxAttemptsCap:
		return nil, fmt.Errorf(`%s: option "max_attempts": %d; want 1 to %d`, Name, o.MaxAttempts, MaxAttemptsCap)
	case o.Backoff < 0:
		return nil, fmt.Errorf(`%s: option "backoff": %s must not be negative`, Name, o.Backoff)
	case o.MaxBackoff < o.Backoff:
		return nil, fmt.Errorf(`%s: option "max_backoff": %s is shorter than backoff (%s)`, Name, o.MaxBackoff, o.Backoff)
	case !(o.Multiplier >= 1) || o.Multiplier > 100:
		return nil, fmt.Errorf(`%s: option "multiplier": %v; want 1 to 100`, Name, o.Multiplier)
	case !(o.Jitter >= 0 && o.Jitter <= 1):
		return nil, fmt.Errorf(`%s: option "jitter": %v; want 0 to 1`, Name, o.Jitter)
	}
	for _, c := range o.RetryableCodes {
		if c == kernel.OK {
			return nil, fmt.Errorf(`%s: option "retryable_codes": OK is no failure to retry`, Name)
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
		backoff:       o.Backoff.D(),
		maxBackoff:    o.MaxBackoff.D(),
		multiplier:    o.Multiplier,
		jitter:        o.Jitter,
		nonIdempotent: slices.Clone(o.NonIdempotent),
		own:           budget,
		budget:        budget,
		log:           o.Logger,
	}
	for _, c := range o.RetryableCodes {
		if int(c) < len(f.codes) {
			f.codes[c] = true
		}
	}
	if f.log == nil {
		f.log = slog.Default()
	}
	return f, nil
}

// Filter retries failed calls; one value serves every call of a client.
type Filter struct {
	maxAttempts   int
	backoff       time.Duration
	maxBackoff    time.Duration
	multiplier    float64
	jitter        float64
	codes         [kernel.Unauthenticated + 1]bool
	nonIdempotent []string
	own           *retrybudget.Budget
	budget        kernel.AttemptBudget // own, or the one it shares (ObservePlugins)
	// Another budget-keeping filter of the client comes before this one
	// (reports: it may run this one, which tells it what it charged) or
	// after it (wraps: it may run in this one's calls of next).
	reports, wraps bool
	log            *slog.Logger
}

var (
	_ kernel.Filter             = (*Filter)(nil)
	_ kernel.StagedFilter       = (*Filter)(nil)
	_ kernel.SidedFilter        = (*Filter)(nil)
	_ kernel.AttemptBudgetOwner = (*Filter)(nil)
	_ kernel.PluginsObserver    = (*Filter)(nil)
)

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

// Tokens reports what the budget the filter spends from holds now.
func (f *Filter) Tokens() float64 { return f.budget.Tokens() }

// Invoke makes the first attempt and, if it fails, the retries.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side != kernel.ClientSide {
		return next(ctx, info, req)
	}
	resp, n, err := f.next(ctx, info, req, next)
	if err == nil {
		f.succeeded(ctx, n)
		return resp, nil
	}
	if f.maxAttempts == 1 {
		n.Pass(f.outer(ctx))
		return nil, err
	}
	return f.retry(ctx, info, req, next, err, n)
}

// next makes an attempt. With another budget-keeping filter after this
// one, which may run in it, it passes on a retrybudget.Nested, returned,
// in which that filter says what it charged.
func (f *Filter) next(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, *retrybudget.Nested, error) {
	if !f.wraps {
		resp, err := next(ctx, info, req)
		return resp, nil, err
	}
	n := retrybudget.NewNested(ctx)
	resp, err := next(n, info, req)
	return resp, n, err
}

// succeeded refunds a success, unless a filter it ran in did, and tells
// a filter this one runs in, if any.
func (f *Filter) succeeded(ctx context.Context, n *retrybudget.Nested) {
	n.Succeeded(f.budget)
	f.outer(ctx).Report(false, false, true)
}

// outer is the budget-keeping filter's Nested this one runs in, if any.
func (f *Filter) outer(ctx context.Context) *retrybudget.Nested {
	if !f.reports {
		return nil
	}
	return retrybudget.Outer(ctx)
}

// retry sends the call again after err, while it may.
func (f *Filter) retry(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker, err error, n *retrybudget.Nested) (any, error) {
	idempotent := !f.matches(info.Method)
	out := f.outer(ctx)
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || !f.retryable(err, idempotent) {
			n.Pass(out) // charged as a filter this one ran in said
			return nil, err
		}
		allowed := n.Failed(f.budget)
		out.Report(true, allowed, false) // err is charged, returned or retried
		if attempt >= f.maxAttempts {
			return nil, err
		}
		if !allowed {
			f.debug(ctx, "not retrying: the retry budget is spent", info, attempt, err, 0)
			return nil, err
		}
		wait := f.wait(attempt)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
			return nil, err
		}
		f.debug(ctx, "retrying", info, attempt, err, wait)
		if !sleep(ctx, wait) {
			return nil, err
		}
		resp, nn, nerr := f.next(ctx, info, req, next)
		if nerr == nil {
			f.succeeded(ctx, nn)
			return resp, nil
		}
		err, n = nerr, nn
	}
}

// retryable reports whether err may be retried: a call the server never
// processed always may, another only if its method is idempotent and its
// code is one of retryable_codes.
func (f *Filter) retryable(err error, idempotent bool) bool {
	st := kernel.StatusOf(err)
	if st.Retryable {
		return true
	}
	return idempotent && int(st.Code) < len(f.codes) && f.codes[st.Code]
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

// wait is the jittered backoff before retry number attempt (from 1).
func (f *Filter) wait(attempt int) time.Duration {
	w := float64(f.backoff)
	for range attempt - 1 {
		w *= f.multiplier
		if w >= float64(f.maxBackoff) {
			break
		}
	}
	w = min(w, float64(f.maxBackoff))
	return time.Duration(w * (1 - f.jitter*rand.Float64()))
}

func (f *Filter) debug(ctx context.Context, msg string, info *kernel.CallInfo, attempt int, err error, wait time.Duration) {
	if !f.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	f.log.LogAttrs(ctx, slog.LevelDebug, Name+": "+msg, slog.String("method", info.Method), slog.Int("attempt", attempt),
		slog.String("code", kernel.CodeOf(err).String()), slog.Duration("wait", wait), slog.Float64("budget_tokens", f.budget.Tokens()))
}

// sleep waits d, or until ctx ends: it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
