// Package tokenbucket is a filter that limits the rate of calls with a
// token bucket: each call takes a token, the bucket holds up to burst of
// them and refills at rate per second. It runs on either side: on the
// server it protects the handlers, on the client it keeps one client from
// sending more than its share.
//
// Config name: "token-bucket". Options, with defaults:
//
//	filters:
//	  - name: token-bucket
//	    side: server           # server or client; both gives each side a bucket of its own
//	    options:
//	      rate: 100            # tokens per second, above 0 (fractions allowed: 0.5 is one every 2s)
//	      burst: 100           # the most tokens the bucket holds, at least 1
//	      scope: global        # global: one bucket for every method; method: one per method
//	      mode: reject         # reject: no token, no call; backoff: wait for the next token
//	      max_wait: 100ms      # backoff: the longest a call waits for its token (never negative)
//
// With no token, mode reject fails the call at once with
// ResourceExhausted. Mode backoff reserves the next token and waits for it
// if it comes within max_wait and before the call's deadline; otherwise it
// rejects at once, since waiting and then failing would only spend the
// caller's time. A call cancelled while it waits gives its token back.
//
// A rejection says when to come back: its response metadata carries
// "retry-after-ms" (RetryAfterKey), the milliseconds, rounded up, until the
// bucket has a token again, and its message says the same for people:
//
//	kernrpc: ResourceExhausted: token-bucket: Echo.Who is over its rate limit (100/s, burst 100, shared by every method); retry after 8ms
//
// A client's caller reads the key from kernrpc.Client.CallWithMetadata. On
// the client the filter runs in the call stage, before the pick: placed
// before a retry filter it limits calls, after one it limits attempts.
//
// On the server the filter takes its token in Admit (kernel.Admitter),
// before the request is decoded, so a rejected call costs no decoding;
// its Invoke then passes the call through.
//
// Scope method keeps one bucket per method, each with the rate and burst
// above (configure the filter twice, with methods: lists, for different
// rates); past 1024 methods, the others share one bucket.
//
// # Readings
//
// The filter is a kernel.StateReporter (state.go): an exporter such as
// the prometheus filter reads, for each bucket, labelled bucket ("global"
// for scope global, else the method's full name, "Echo.Who", and "_other"
// for the shared bucket past 1024 methods):
//
//	token_bucket_tokens{bucket}          gauge: tokens it holds now, fractions included (0 while tokens are reserved ahead in mode backoff)
//	token_bucket_rejected_total{bucket}  counter: calls it rejected
//
// A rejection costs one atomic add more; a call that gets its token
// costs nothing more.
package tokenbucket

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "token-bucket"

// RetryAfterKey is the response metadata key of a rejection: how many
// milliseconds until the bucket has a token again, as a decimal integer.
const RetryAfterKey = "retry-after-ms"

// The values of Options.Scope and Options.Mode.
const (
	ScopeGlobal = "global"
	ScopeMethod = "method"

	ModeReject  = "reject"
	ModeBackoff = "backoff"
)

// Options configure the filter. The package doc lists them with their
// defaults.
type Options struct {
	// Rate is how many tokens the bucket gains per second. Tokens come a
	// whole number of nanoseconds apart, rounded up: a rate that does not
	// divide a second evenly admits no more than it says (6e8/s: one
	// token every 2ns).
	Rate float64 `json:"rate"`
	// Burst is the most tokens the bucket holds: how many calls may come at
	// once after a quiet spell.
	Burst int `json:"burst"`
	// Scope is "global" (one bucket) or "method" (one per method).
	Scope string `json:"scope"`
	// Mode is "reject" or "backoff".
	Mode string `json:"mode"`
	// MaxWait is, in mode backoff, the longest a call waits for a token.
	MaxWait kernel.Duration `json:"max_wait"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Rate: 100, Burst: 100, Scope: ScopeGlobal, Mode: ModeReject, MaxWait: kernel.Duration(100 * time.Millisecond)}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "limits the rate of calls with a token bucket, telling rejected callers when to come back", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	if !(o.Rate > 0) || math.IsInf(o.Rate, 1) {
		return nil, fmt.Errorf("option \"rate\": must be a number of tokens per second above 0, got %v", o.Rate)
	}
	if float64(time.Second)/o.Rate > 1<<50 {
		return nil, fmt.Errorf("option \"rate\": %v per second is less than one token in 13 days", o.Rate)
	}
	// Rounded up to a whole nanosecond, so that the bucket never admits
	// more than rate: rounded down, 6e8/s (1.67ns a token) would admit 1e9.
	interval := int64(math.Ceil(float64(time.Second) / o.Rate))
	if float64(time.Second)/o.Rate < 1 {
		return nil, fmt.Errorf("option \"rate\": %v per second is more than one token per nanosecond", o.Rate)
	}
	if o.Burst < 1 {
		return nil, fmt.Errorf("option \"burst\": must be at least 1 token, got %d", o.Burst)
	}
	if int64(o.Burst) > math.MaxInt64/2/interval {
		return nil, fmt.Errorf("option \"burst\": %d tokens at %v per second are too many to count", o.Burst, o.Rate)
	}
	f := &Filter{rate: strconv.FormatFloat(o.Rate, 'g', -1, 64) + "/s, burst " + strconv.Itoa(o.Burst)}
	switch o.Scope {
	case ScopeGlobal:
		f.global = newBucket(interval, o.Burst)
		f.rate += ", shared by every method"
	case ScopeMethod:
		f.perMethod = newBuckets(interval, o.Burst)
		f.rate += ", per method"
	default:
		return nil, fmt.Errorf("option \"scope\": must be %s or %s, got %q", ScopeGlobal, ScopeMethod, o.Scope)
	}
	if o.MaxWait < 0 {
		// Refused in mode reject too, which does not use it: a negative
		// wait is a mistake whatever the mode.
		return nil, fmt.Errorf("option \"max_wait\": must not be negative, got %s", o.MaxWait)
	}
	switch o.Mode {
	case ModeReject:
	case ModeBackoff:
		if o.MaxWait <= 0 {
			return nil, fmt.Errorf("option \"max_wait\": mode backoff needs a positive wait, got %s", o.MaxWait)
		}
		f.maxWait = int64(o.MaxWait.D())
		f.late = " and its next token comes after max_wait (" + o.MaxWait.String() + ") or the call's deadline"
	default:
		return nil, fmt.Errorf("option \"mode\": must be %s or %s, got %q", ModeReject, ModeBackoff, o.Mode)
	}
	base := time.Now()
	f.now = func() int64 { return int64(time.Since(base)) }
	f.sleep = f.sleepTimer
	return f, nil
}

// Filter is the token-bucket filter.
type Filter struct {
	global    *bucket  // scope global
	perMethod *buckets // scope method
	maxWait   int64    // ns; 0 in mode reject
	rate      string   // "100/s, burst 100, per method", for messages
	late      string   // mode backoff: why a call did not wait, for messages

	// now reads the clock (ns since the filter was built) and sleep waits
	// for d or until ctx ends: tests replace both before the first call.
	now    func() int64
	sleep  func(ctx context.Context, d time.Duration) error
	timers sync.Pool // of *time.Timer, stopped
}

var (
	_ kernel.Filter   = (*Filter)(nil)
	_ kernel.Admitter = (*Filter)(nil)
)

// Invoke takes a token for the call, then passes it on. On the server the
// token was taken in Admit, so the call passes straight on.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side == kernel.ClientSide {
		if err := f.Admit(ctx, info); err != nil {
			return nil, err
		}
	}
	return next(ctx, info, req)
}

// Admit takes a token for the call, waiting for it in mode backoff, or
// rejects it with ResourceExhausted and RetryAfterKey in its response
// metadata.
func (f *Filter) Admit(ctx context.Context, info *kernel.CallInfo) error {
	b := f.global
	if b == nil {
		b = f.perMethod.lookup(info.Method)
	}
	now := f.now()
	maxWait := f.maxWait
	if maxWait > 0 {
		if dl, ok := ctx.Deadline(); ok {
			// Not below 0: a call whose deadline has passed still takes a
			// token that is there now, as in mode reject, rather than being
			// told the bucket is over its limit (retry after a negative time).
			maxWait = max(0, min(maxWait, int64(time.Until(dl))-1))
		}
	}
	wait, ok := b.take(now, maxWait)
	if !ok {
		b.rejected.Add(1)
		return f.reject(info, wait)
	}
	if wait == 0 {
		return nil
	}
	if err := f.sleep(ctx, time.Duration(wait)); err != nil {
		b.giveBack()
		st := kernel.StatusOf(err)
		return &kernel.Status{Code: st.Code, Message: "token-bucket: " + info.Method + " ended while it waited " +
			time.Duration(wait).String() + " for a token (" + f.rate + "): " + st.Message}
	}
	return nil
}

// reject answers a call that got no token: wait is how long until the
// bucket has one.
func (f *Filter) reject(info *kernel.CallInfo, wait int64) error {
	ms := (wait + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	info.SetResponseMetadata(RetryAfterKey, strconv.FormatInt(ms, 10))
	return &kernel.Status{Code: kernel.ResourceExhausted, Message: "token-bucket: " + info.Method + " is over its rate limit (" +
		f.rate + ")" + f.late + "; retry after " + strconv.FormatInt(ms, 10) + "ms"}
}

// sleepTimer waits for d on a pooled timer, or until ctx ends.
func (f *Filter) sleepTimer(ctx context.Context, d time.Duration) error {
	t, _ := f.timers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(d)
	} else {
		t.Reset(d)
	}
	defer f.timers.Put(t)
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}
