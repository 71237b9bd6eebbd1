// Package overload is a server filter that keeps a server under its
// capacity without a hand-set threshold: it learns how many calls may be in
// flight at once from their latency, and rejects the excess at once with
// ResourceExhausted and the retryable flag (the call was not processed, a
// client may send it elsewhere), before its request is decoded.
//
// Config name: "overload". Options, with defaults:
//
//	filters:
//	  - name: overload
//	    side: server
//	    options:
//	      mode: gradient      # gradient: reject above the learned limit; codel: queue above it, shed by queue delay
//	      initial_limit: 20   # the concurrency limit before anything is learned
//	      min_limit: 20       # the limit never falls below this...
//	      max_limit: 1000     # ...nor rises above this
//	      target: 5ms         # codel: the queue delay to keep under
//	      interval: 100ms     # codel: how long the delay must stay above target before calls are shed
//
// # Mode gradient
//
// The limit follows the ratio of long-term to short-term latency, as
// Gradient2 in Netflix's concurrency-limits does. Each completed call is a
// sample of latency (its time in the filters after this one and the
// handler). Samples are grouped in windows of as many calls as the limit
// (at least 10, at most 1s): about one round trip of every call in flight.
// Per window, short is the window's mean latency and long an exponential
// mean of short over 600 windows; then
//
//	gradient = clamp(1.5 · long / short, 0.5, 1)
//	limit    = 0.8 · limit + 0.2 · (limit · gradient + 4)
//
// While latency holds (short under 1.5 · long) the limit grows by 0.8
// (0.2 · 4) a window, probing for capacity; once calls queue inside the
// server (short rises) it shrinks, at most by about a tenth a window. A
// window in which fewer than half the limit were in flight leaves it be. A call is
// admitted while fewer than the limit are in flight, and rejected at once
// otherwise. Admit counts in-flight calls that Invoke counts, and takes
// nothing itself: a call admitted whose request then fails to decode costs
// nothing, and a handful admitted at the same instant may pass the limit
// by the few calls that are between Admit and Invoke.
//
// # Mode codel
//
// The same learned limit bounds the calls in flight, but a call above it
// waits, in Admit, in a first-in first-out queue of at most limit calls,
// for a slot. There is no other queue in the server that the filter could
// measure (a frame's arrival time is not known to filters), so this wait
// is CoDel's queue: a call's queue delay is its sojourn in it. CoDel (RFC
// 8289) watches the sojourn of each call leaving the queue: once it has
// stayed at or above target for a whole interval, it sheds the call
// leaving, then others at interval/√n after the n-th, until a call leaves
// below target or the queue empties. While it sheds, a call that would
// have to wait is rejected at once instead (it would only wait past the
// target), and so is one that finds the queue full. A call whose context
// ends while it waits leaves the queue with its context's error.
//
// On the client side (not what it is for) it judges each call in Invoke.
//
// # Readings
//
// The filter is a kernel.StateReporter (state.go): an exporter such as
// the prometheus filter reads
//
//	overload_limit               gauge: the concurrency limit learnt, calls admitted at once
//	overload_calls_in_flight     gauge: calls admitted that have not ended
//	overload_calls_queued        gauge: calls waiting for a slot (mode codel; 0 in mode gradient)
//	overload_shed_total{reason}  counter: calls rejected, by reason: limit (gradient), queue-full or queue-delay (codel)
//
// A rejection costs one atomic add more; an admitted call nothing more.
package overload

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "overload"

// The values of Options.Mode.
const (
	ModeGradient = "gradient"
	ModeCodel    = "codel"
)

// Options configure the filter. The package doc lists them with their
// defaults.
type Options struct {
	// Mode is "gradient" or "codel".
	Mode string `json:"mode"`
	// InitialLimit is the concurrency limit before any window is complete.
	InitialLimit int `json:"initial_limit"`
	// MinLimit and MaxLimit bound the learned limit.
	MinLimit int `json:"min_limit"`
	MaxLimit int `json:"max_limit"`
	// Target is, in mode codel, the queue delay to keep under.
	Target kernel.Duration `json:"target"`
	// Interval is, in mode codel, how long the queue delay must stay at or
	// above Target before calls are shed.
	Interval kernel.Duration `json:"interval"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Mode: ModeGradient, InitialLimit: 20, MinLimit: 20, MaxLimit: 1000,
		Target: kernel.Duration(5 * time.Millisecond), Interval: kernel.Duration(100 * time.Millisecond)}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "rejects calls above a concurrency limit learned from latency (or shed by queue delay, CoDel), before decoding", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	if o.MinLimit < 1 {
		return nil, fmt.Errorf("option \"min_limit\": must be at least 1 call, got %d", o.MinLimit)
	}
	if o.MaxLimit < o.MinLimit {
		return nil, fmt.Errorf("option \"max_limit\": must be at least min_limit (%d), got %d", o.MinLimit, o.MaxLimit)
	}
	if o.InitialLimit < o.MinLimit || o.InitialLimit > o.MaxLimit {
		return nil, fmt.Errorf("option \"initial_limit\": must be from min_limit (%d) to max_limit (%d), got %d", o.MinLimit, o.MaxLimit, o.InitialLimit)
	}
	f := &Filter{g: newGradient(o.InitialLimit, o.MinLimit, o.MaxLimit)}
	f.limit.Store(f.g.admits())
	switch o.Mode {
	case ModeGradient:
	case ModeCodel:
		if o.Target <= 0 {
			return nil, fmt.Errorf("option \"target\": must be a positive queue delay, got %s", o.Target)
		}
		if o.Interval < o.Target {
			return nil, fmt.Errorf("option \"interval\": must be at least target (%s), got %s", o.Target, o.Interval)
		}
		f.cd = &codel{target: int64(o.Target.D()), interval: int64(o.Interval.D())}
		f.targetText = o.Target.String()
	default:
		return nil, fmt.Errorf("option \"mode\": must be %s or %s, got %q", ModeGradient, ModeCodel, o.Mode)
	}
	base := time.Now()
	f.now = func() int64 { return int64(time.Since(base)) }
	return f, nil
}

// Filter is the overload filter.
type Filter struct {
	inflight atomic.Int64 // calls in Invoke
	limit    atomic.Int64 // g.admits(), for Admit to read without the lock
	// shed counts the calls rejected, by why, for ReportState.
	shed [numShedReasons]atomic.Uint64

	mu sync.Mutex
	g  gradient

	// Mode codel: cd is nil in mode gradient.
	cd         *codel
	queue      []*waiter // FIFO; queue[0] waited longest
	granted    int       // waiters woken with a slot that have not run yet
	waiters    sync.Pool // of *waiter
	targetText string

	// now reads the clock (ns since the filter was built): tests replace
	// it before the first call.
	now func() int64
}

// waiter is one call waiting for a slot in mode codel.
type waiter struct {
	ch   chan struct{} // buffered: the waker never blocks
	enq  int64
	drop bool // set before ch is signalled: shed rather than admitted
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.Admitter     = (*Filter)(nil)
	_ kernel.CallObserver = (*Filter)(nil)
)

// CallEnded hands, in mode codel, the slot of a call answered before its
// Invoke to the call waiting longest. A call woken with a slot gives it
// up as its Admit returns, counting on its Invoke to take it: one that a
// later Admitter refused, or whose request did not decode, never does,
// and without this the calls still waiting would wait for the next call
// to end or arrive, or for their deadline, with the slot free.
func (f *Filter) CallEnded(_ *kernel.CallInfo, _ error, handled bool) {
	if f.cd == nil || handled {
		return
	}
	f.mu.Lock()
	if len(f.queue) > 0 && f.inflight.Load()+int64(f.granted) < f.limit.Load() {
		f.wake(f.now())
	}
	f.mu.Unlock()
}

// Invoke counts the call in flight while it runs and learns from its
// latency. On the server it was admitted in Admit; on the client it is
// admitted here.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side == kernel.ClientSide {
		if err := f.Admit(ctx, info); err != nil {
			return nil, err
		}
	}
	n := f.inflight.Add(1)
	defer f.done(f.now(), n)
	return next(ctx, info, req)
}

// done ends a call that started at start with n calls in flight.
func (f *Filter) done(start, n int64) {
	now := f.now()
	f.mu.Lock()
	f.inflight.Add(-1)
	if f.g.sample(now, now-start, int(n)) {
		f.limit.Store(f.g.admits())
	}
	if f.cd != nil {
		f.wake(now)
	}
	f.mu.Unlock()
}

// Admit admits the call if fewer calls than the learned limit are in
// flight; otherwise it rejects it (mode gradient) or queues it (mode
// codel).
func (f *Filter) Admit(ctx context.Context, info *kernel.CallInfo) error {
	if f.cd == nil {
		if n, l := f.inflight.Load(), f.limit.Load(); n >= l {
			f.shed[shedLimit].Add(1)
			return f.reject(info, strconv.FormatInt(n, 10)+" calls in flight, at the limit learned from their latency ("+strconv.FormatInt(l, 10)+")")
		}
		return nil
	}
	return f.admitQueued(ctx, info)
}

func (f *Filter) admitQueued(ctx context.Context, info *kernel.CallInfo) error {
	f.mu.Lock()
	l := f.limit.Load()
	if len(f.queue) > 0 && f.inflight.Load()+int64(f.granted) < l {
		// Slots free with calls waiting: a call woken for one failed
		// before Invoke (its request did not decode). Hand them on.
		f.wake(f.now())
	}
	if len(f.queue) == 0 && f.inflight.Load()+int64(f.granted) < l {
		f.mu.Unlock()
		return nil
	}
	if f.cd.dropping {
		f.mu.Unlock()
		f.shed[shedQueueDelay].Add(1)
		return f.reject(info, "the queue delay has stayed above "+f.targetText+"; shedding calls that would wait")
	}
	if int64(len(f.queue)) >= l {
		f.mu.Unlock()
		f.shed[shedQueueFull].Add(1)
		return f.reject(info, "its queue is full ("+strconv.FormatInt(l, 10)+" calls wait for the "+strconv.FormatInt(l, 10)+" in flight)")
	}
	w, _ := f.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{ch: make(chan struct{}, 1)}
	}
	w.enq, w.drop = f.now(), false
	f.queue = append(f.queue, w)
	f.mu.Unlock()

	select {
	case <-w.ch:
	case <-ctx.Done():
		f.mu.Lock()
		if f.unqueue(w) {
			f.mu.Unlock()
			f.waiters.Put(w)
			st := kernel.StatusOf(context.Cause(ctx))
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				st = &kernel.Status{Code: kernel.DeadlineExceeded, Message: st.Message}
			}
			return &kernel.Status{Code: st.Code, Message: "overload: " + info.Method + " ended while it waited for a slot: " + st.Message}
		}
		f.mu.Unlock()
		<-w.ch // woken as it ended: take the answer as if it came first
	}
	sojourn, drop := f.now()-w.enq, w.drop
	if !drop {
		f.mu.Lock()
		f.granted--
		f.mu.Unlock()
	}
	f.waiters.Put(w)
	if drop {
		f.shed[shedQueueDelay].Add(1)
		return f.reject(info, "it waited "+time.Duration(sojourn).Round(time.Microsecond).String()+
			" for a slot, and the queue delay has stayed above "+f.targetText)
	}
	return nil
}

// wake hands the free slots to the calls waiting longest, or sheds them as
// CoDel says; f.mu is held.
func (f *Filter) wake(now int64) {
	if len(f.queue) == 0 {
		// A slot freed and nobody waits for it: the delay is gone.
		f.cd.empty()
		return
	}
	free := f.limit.Load() - f.inflight.Load() - int64(f.granted)
	for free > 0 && len(f.queue) > 0 {
		w := f.queue[0]
		copy(f.queue, f.queue[1:])
		f.queue[len(f.queue)-1] = nil
		f.queue = f.queue[:len(f.queue)-1]
		if w.drop = f.cd.dequeue(now, now-w.enq); !w.drop {
			f.granted++
			free--
		}
		w.ch <- struct{}{}
	}
}

// unqueue takes w out of the queue, reporting whether it was there (not
// woken yet); f.mu is held.
func (f *Filter) unqueue(w *waiter) bool {
	for i, q := range f.queue {
		if q == w {
			copy(f.queue[i:], f.queue[i+1:])
			f.queue[len(f.queue)-1] = nil
			f.queue = f.queue[:len(f.queue)-1]
			return true
		}
	}
	return false
}

// reject answers a call the filter does not admit: not processed, so
// retryable.
func (f *Filter) reject(info *kernel.CallInfo, why string) error {
	return &kernel.Status{Code: kernel.ResourceExhausted, Retryable: true,
		Message: "overload: " + info.Method + " rejected, the server is over its capacity: " + why + "; the call was not processed"}
}
