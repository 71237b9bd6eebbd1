package kernrpc

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A deadline the client gives a call itself (client.timeout, or a
// kernel.Deadliner filter's) to a caller's context that cannot be canceled
// lives in the call's chainCtx, with a timer and channel kept with the
// pooled callState, instead of a context.WithTimeout of its own, which
// costs several allocations per call. The engine waits on it without
// handing its channel out, and tcp-lv reads with a socket deadline for it
// (kernel.DeadlineOnly), so that a call that meets its deadline costs no
// allocation and no goroutine for it. A context with a deadline that
// passed, or whose call is over, reads as done, as one from WithTimeout
// does once its cancel has run.

// callDeadline is the deadline state of the calls a callState serves, one
// after another. It outlives each call's reset of the callState, so that
// its timer, if it fires late, touches nothing the next call reuses but
// what its mutex guards.
type callDeadline struct {
	mu sync.Mutex
	// chain is the live call's context (nil between calls) and expired
	// whether its deadline was found passed: written under mu, read
	// without it by Err, which a call asks several times.
	chain    atomic.Pointer[chainCtx]
	expired  atomic.Bool
	timer    *time.Timer   // made once; see armLocked
	armedFor time.Time     // what timer is set for; zero: not set
	done     chan struct{} // made once, remade only after it was closed
	exposed  atomic.Bool   // done left the engine: close it when the call ends
	afters   []*afterFunc  // registered through chainCtx.AfterFunc
	waiter   *attempt      // woken at the deadline in place of a done channel (sleeper)
}

// afterFunc is one function registered through chainCtx.AfterFunc.
type afterFunc struct{ f func() }

// withDeadline makes the context filters (and, without filters, the
// attempt) get for a call whose caller's ctx has no deadline and cannot be
// canceled: ctx with the deadline timeout away, given by the filter named
// by ("" for client.timeout).
func (cs *callState) withDeadline(ctx context.Context, timeout time.Duration, by string) *chainCtx {
	if cs.dl == nil {
		cs.dl = &callDeadline{}
	}
	dl := deadlineIn(timeout)
	c := &chainCtx{Context: ctx, cs: cs, dl: cs.dl, deadline: dl}
	cs.given, cs.givenTimeout, cs.givenBy = dl, timeout, by
	cs.chain = c
	cs.sendGiven.Store(true)
	// No lock: between calls only a late timer runs, and it reads the
	// flags only through the live chain, published last.
	d := cs.dl
	// Loads first: a store is an exchange, and these are mostly false.
	if d.exposed.Load() {
		d.exposed.Store(false)
	}
	if d.expired.Load() {
		d.expired.Store(false)
	}
	d.chain.Store(c)
	return c
}

// sentTimeout is the timeout a request sent under ctx, whose deadline is
// dl, carries. The first request of a call whose deadline the client gave
// it in place (withDeadline) carries that timeout as given, without a
// clock read: it overstates what is left by the microseconds spent since,
// which the request's transit, that no timeout counts, exceeds anyway.
// Later attempts, contexts derived from the chain's, and a first request
// that may have waited (for an instance, a dial, a pause, or in a filter:
// whatever asked for the chain's Done or dialled, see waited) read the
// clock.
func (cs *callState) sentTimeout(ctx context.Context, dl time.Time) time.Duration {
	if c, ok := ctx.(*chainCtx); ok && c == cs.chain && cs.sendGiven.CompareAndSwap(true, false) {
		return cs.givenTimeout
	}
	return time.Until(dl)
}

// waited says the call may have waited since its deadline was given in
// place: its first request reads the clock for the timeout it sends.
func (cs *callState) waited() {
	if cs != nil && cs.sendGiven.Load() {
		cs.sendGiven.Store(false)
	}
}

// deadlineIn is time.Now().Add(d) from one read of the monotonic clock,
// where time.Now reads the wall clock too (some 20 ns a call): the wall
// reading of such a deadline is off from the system's only by how far the
// wall clock was stepped or slewed since the process started, and Until,
// Before and the timeout sent to the server use the monotonic one.
func deadlineIn(d time.Duration) time.Time { return deadlineFrom(monoNow(), d) }

// monoNow is the monotonic clock as deadlineIn reads it, so that a reading
// taken for another purpose can place a deadline later (deadlineFrom).
func monoNow() time.Duration { return time.Since(clockBase) }

// deadlineFrom is deadlineIn(d) for a clock read at now (monoNow). A d so
// large that now+d would overflow (a timeout of math.MaxInt64 that a
// caller meant as none, sent as it was) is added in two steps instead of
// wrapping into the past: time.Time's Add, out of the monotonic clock's
// range, places the deadline by the wall clock.
func deadlineFrom(now, d time.Duration) time.Time {
	if d > math.MaxInt64-now {
		return clockBase.Add(now).Add(d)
	}
	return clockBase.Add(now + d)
}

var clockBase = time.Now()

// doneFor is c's Done: external when it leaves the engine, which must then
// close it when the call ends, since whoever holds it may wait on it. It
// reads no clock: a timer set for a deadline already passed fires at once.
func (d *callDeadline) doneFor(c *chainCtx, external bool) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.chain.Load() != c || d.expired.Load() {
		return closedChan
	}
	// Whoever asks may wait on it (a filter pausing, the engine waiting for
	// an instance or a dial): c's call is live, so c.cs is its own.
	c.cs.waited()
	if d.done == nil {
		d.done = make(chan struct{})
	}
	if external {
		d.exposed.Store(true)
	}
	d.armLocked()
	return d.done
}

// errFor is c's Err. It reads the clock, so that it is DeadlineExceeded
// as soon as the deadline has passed (kernel.DeadlineOnly), and takes the
// lock only when the answer is not nil.
func (d *callDeadline) errFor(c *chainCtx) error {
	if d.chain.Load() == c && !d.expired.Load() && time.Until(c.deadline) > 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.chain.Load() != c {
		return c.endErr
	}
	d.expireLocked()
	return context.DeadlineExceeded
}

// afterFunc is c's AfterFunc, through which contexts derived from c (a
// hedge's per attempt) are told of its end without a goroutine each.
func (d *callDeadline) afterFunc(c *chainCtx, f func()) (stop func() bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.chain.Load() != c || d.expireLocked() {
		go f()
		return func() bool { return false }
	}
	d.exposed.Store(true)
	a := &afterFunc{f}
	d.afters = append(d.afters, a)
	d.armLocked()
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		for i, b := range d.afters {
			if b == a {
				d.afters = append(d.afters[:i], d.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

// armLocked makes sure the timer fires by the live call's deadline. A
// timer set for an earlier call's deadline, which is no later, is left
// alone: resetting it on every call costs a timer update that can wake
// the netpoller, while one that fires early only sets itself again.
func (d *callDeadline) armLocked() {
	deadline := d.chain.Load().deadline
	if !d.armedFor.IsZero() && !d.armedFor.After(deadline) {
		return
	}
	d.armedFor = deadline
	if d.timer == nil {
		d.timer = time.AfterFunc(time.Until(deadline), d.fire)
	} else {
		d.timer.Reset(time.Until(deadline))
	}
}

// fire runs on the timer, which may have been set for an earlier call's
// deadline: then it sets itself for the live call's, if one waits.
func (d *callDeadline) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armedFor = time.Time{}
	if d.chain.Load() != nil && !d.expireLocked() && (d.done != nil || len(d.afters) > 0 || d.waiter != nil) {
		d.armLocked()
	}
}

// expireLocked reports whether the live call's deadline has passed, ending
// its context the first time it finds so.
func (d *callDeadline) expireLocked() bool {
	if d.expired.Load() {
		return true
	}
	if time.Until(d.chain.Load().deadline) > 0 { // one clock read: the deadline is monotonic
		return false
	}
	d.expired.Store(true)
	d.endLocked()
	return true
}

// endLocked closes what waits on the live call's context.
func (d *callDeadline) endLocked() {
	if d.done != nil {
		close(d.done)
		d.done = nil
	}
	for i, a := range d.afters {
		go a.f()
		d.afters[i] = nil
	}
	d.afters = d.afters[:0]
	if d.waiter != nil {
		d.waiter.signal()
		d.waiter = nil
	}
}

// end ends the call's context as the call returns, as a WithTimeout's
// deferred cancel does: attempts still running (a hedge's slower one) and
// whoever holds a channel of it see it done. A channel only the engine
// waited on, with no attempt left, stays open for the next call.
func (d *callDeadline) end(c *chainCtx, attemptsLeft bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.chain.Load() != c {
		return
	}
	// A deadline that passed unobserved did not end the call, which
	// answered: its end reads as the cancel that followed.
	c.endErr = context.Canceled
	if d.expired.Load() {
		c.endErr = context.DeadlineExceeded
	}
	// Err's lock-free path must see the call over before anything woken
	// here asks it: a closed Done with a nil Err breaks the contract (and
	// a derived context's cancel panics on it).
	d.chain.Store(nil)
	waiter := d.waiter
	d.waiter = nil
	if !d.expired.Load() && (d.exposed.Load() || attemptsLeft) {
		d.endLocked()
		if attemptsLeft && waiter != nil {
			// An attempt a filter left running may wait on it (sleeper):
			// it sees the call over, as under a WithTimeout's cancel.
			waiter.signal()
		}
	}
}

// chainCtx is the context filters get: the caller's, through which the
// chain's ends find cs, with the deadline the client gave the call, if it
// gave one in place. It is a value of its own, not cs, which is pooled: a
// context a filter derives from it may run its timer, and ask its parent
// for Done, after the call has returned and cs serves another call.
type chainCtx struct {
	context.Context
	cs       *callState
	dl       *callDeadline // set with deadline
	deadline time.Time
	endErr   error // Err once the call is over; under dl.mu
}

func (cs *callState) chainContext() context.Context {
	if cs.chain != nil {
		return cs.chain
	}
	return &chainCtx{Context: cs.Context, cs: cs}
}

func (c *chainCtx) Value(key any) any {
	if key == (callStateKey{}) {
		return c.cs
	}
	return c.Context.Value(key)
}

func (c *chainCtx) Deadline() (time.Time, bool) {
	if c.dl == nil {
		return c.Context.Deadline()
	}
	return c.deadline, true
}

func (c *chainCtx) Done() <-chan struct{} {
	if c.dl == nil {
		return c.Context.Done()
	}
	return c.dl.doneFor(c, true)
}

func (c *chainCtx) Err() error {
	if c.dl == nil {
		return c.Context.Err()
	}
	return c.dl.errFor(c)
}

// AfterFunc lets context.AfterFunc, and contexts derived from c, watch c
// without a goroutine of their own.
func (c *chainCtx) AfterFunc(f func()) (stop func() bool) {
	if c.dl == nil {
		return context.AfterFunc(c.Context, f)
	}
	return c.dl.afterFunc(c, f)
}

// DeadlineOnly tells transports (kernel.DeadlineOnly) that the deadline
// is all that ends c while its call waits: its caller's ctx cannot be
// canceled.
func (c *chainCtx) DeadlineOnly() (time.Time, bool) {
	if c.dl == nil {
		return time.Time{}, false
	}
	return c.deadline, true
}

// waitsOutDial reports whether ctx cannot end before a dial bounded by d
// does: nothing can cancel it, or only a deadline at least d away (asked
// without making the channel of one given in place).
func waitsOutDial(ctx context.Context, d time.Duration) bool {
	if dl, ok := kernel.DeadlineOnly(ctx); ok {
		return time.Until(dl) >= d
	}
	return ctx.Done() == nil
}

// sleeper is how an attempt that is not reading waits for its wake-up or
// the end of its ctx. A deadline the client gave in place wakes the
// attempt itself (callDeadline.wakeAt), so the wait is a receive on one
// channel: a select on two costs some 100 ns more a call, as both
// channels are locked to park and again to wake.
type sleeper struct {
	done  <-chan struct{} // ctx's, once asked for (engineDone)
	wakes bool            // the in-place deadline wakes the attempt
}

// sleep reports whether at was woken, false once ctx is done.
func (w *sleeper) sleep(ctx context.Context, at *attempt) bool {
	if c, ok := ctx.(*chainCtx); ok && c.dl != nil && w.done == nil {
		if !w.wakes {
			switch c.dl.wakeAt(c, at) {
			case deadlinePassed:
				return false
			case deadlineWakes:
				w.wakes = true
			}
		}
		if w.wakes {
			<-at.wake
			// Done at the deadline, or once the call is over (end wakes
			// an attempt left running).
			return !c.dl.expired.Load() && c.dl.chain.Load() == c
		}
	}
	if w.done == nil {
		w.done = engineDone(ctx)
	}
	select {
	case <-at.wake:
		return true
	case <-w.done:
		return false
	}
}

// What wakeAt did.
const (
	deadlineWakes  = iota // the timer wakes the attempt at the deadline
	deadlinePassed        // the deadline has passed (or the call is over)
	deadlineTaken         // another attempt waits under this deadline: use Done
)

// wakeAt makes the deadline's timer wake at when c's deadline passes. It
// reads no clock: a timer set for a deadline already passed fires at once.
// The waiter is forgotten as the call ends: a late wake-up only makes at
// look around once more.
func (d *callDeadline) wakeAt(c *chainCtx, at *attempt) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.chain.Load() != c || d.expired.Load():
		return deadlinePassed
	case d.waiter != nil && d.waiter != at:
		return deadlineTaken
	}
	d.waiter = at
	d.armLocked()
	return deadlineWakes
}

// engineDone is ctx.Done for the engine's own wait: the channel of an
// in-place deadline stays in the engine, so the call need not close it.
func engineDone(ctx context.Context) <-chan struct{} {
	if c, ok := ctx.(*chainCtx); ok && c.dl != nil {
		return c.dl.doneFor(c, false)
	}
	return ctx.Done()
}

var _ interface {
	context.Context
	AfterFunc(func()) func() bool
} = (*chainCtx)(nil)

// givenTimeout is the deadline the client gives a call of info.Method
// whose caller set none, and the name of the filter that gives it ("" for
// client.timeout).
func (c *Client) givenTimeout(info *kernel.CallInfo) (time.Duration, string) {
	if t := c.cfg.Client.Timeout.D(); t > 0 {
		return t, ""
	}
	return timeoutFrom(c.deadliners, info)
}
