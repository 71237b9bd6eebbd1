package hedge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/internal/retrybudget"
	"github.com/kernrpc/kernrpc/kernel"
)

// call is one hedged call. The first attempt runs on the caller's
// goroutine; its timer (see timer.go) starts each hedge on a goroutine of
// its own. The
// caller returns only once every attempt it started has returned, so
// that nothing uses the call's info or req afterwards. A call whose timer
// never fired is reused for a later call. Lock order: call.mu, then
// clock.mu.
type call struct {
	f     *Filter
	timer *time.Timer   // runs fire, for delays off the clock
	done  chan struct{} // receives the decision, once per call
	wg    sync.WaitGroup

	// The clock's, under its mu: the slot on its heap (-1: off it), the
	// deadline there, and whether it popped c to fire it.
	slot     int
	deadline int64
	popped   bool
	onClock  bool // the timer armed is the clock's (under c.mu)

	mu sync.Mutex
	// Set before the first attempt, under mu; read-only afterwards.
	ctx    context.Context
	cancel context.CancelFunc
	next   kernel.Invoker
	req    any
	tr     *tracker
	delay  time.Duration
	base   kernel.CallInfo // what a hedge starts from: its Metadata a snapshot no attempt uses
	method string

	cis      [MaxAttemptsCap]kernel.CallInfo // each attempt's own
	launched int                             // attempts started
	pending  int                             // attempts not yet returned
	decided  bool                            // resp, err and winner are the call's outcome
	over     bool                            // the caller is ending the call: no more attempts
	fired    bool                            // the timer ran: the call is not reused
	winner   int
	resp     any
	err      error
	// How the outcome was accounted for, for a budget-keeping filter this
	// one runs in: what retrybudget.Nested.Report takes.
	charged, allowed, refunded bool
	// panicked is set when the attempt that decided the call panicked
	// (or exited its goroutine): the caller panics again with panicVal,
	// on its own goroutine, once every attempt has returned.
	panicked bool
	panicVal any
}

func (f *Filter) newCall() *call {
	return &call{f: f, done: make(chan struct{}, 1), slot: -1}
}

// hedged runs a call that may be hedged after delay.
func (f *Filter) hedged(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker, tr *tracker, delay time.Duration) (any, error) {
	c := f.calls.Get().(*call)
	c.mu.Lock()
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.next, c.req, c.tr, c.delay, c.method = next, req, tr, delay, info.Method
	c.base = *info
	c.base.ResponseMetadata = nil
	if len(info.Metadata) > 0 {
		// Filters after this one may add to an attempt's metadata while
		// the next attempt copies it: hedges copy this snapshot instead.
		c.base.Metadata = info.Metadata.Clone()
	} else {
		// Not an empty map the first attempt shares: hedges start with
		// none, and SetRequestMetadata makes each its own.
		c.base.Metadata = nil
	}
	c.cis[0] = *info
	c.launched, c.pending, c.winner = 1, 1, -1
	f.arm(c, delay)
	c.mu.Unlock()

	c.run(0)
	<-c.done

	c.mu.Lock()
	c.over = true
	fired := c.fired
	c.mu.Unlock()
	c.mu.Lock()
	stopped := f.disarm(c)
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	resp, err := c.resp, c.err
	w := &c.cis[c.winner]
	info.Instance, info.Peer, info.ResponseMetadata = w.Instance, w.Peer, w.ResponseMetadata
	info.RequestSize, info.ResponseSize = w.RequestSize, w.ResponseSize
	// Attempt says, for the filters before this one, how many attempts
	// the call took (kernrpc_client_attempts_total, a call span's
	// rpc.kernrpc.attempt): the highest number any attempt was given
	// (the engine numbers a cancelled loser's too, and those a retry
	// filter after this one made in it), and at least those launched.
	info.Attempt = c.launched
	for i := range c.launched {
		info.Attempt = max(info.Attempt, c.cis[i].Attempt)
	}
	c.f.outer(ctx).Report(c.charged, c.allowed, c.refunded)
	if c.panicked {
		// The panic of an attempt, on whichever goroutine, is the
		// caller's, as it would be without hedging: a recover filter
		// before this one makes it the call's error. c is not reused.
		panic(c.panicVal)
	}
	if !fired && stopped {
		// The timer never ran for this call and never will: no goroutine
		// but this one holds c.
		c.reset()
		f.calls.Put(c)
	}
	return resp, err
}

func (c *call) reset() {
	c.ctx, c.cancel, c.next, c.req, c.tr = nil, nil, nil, nil, nil
	c.base, c.cis = kernel.CallInfo{}, [MaxAttemptsCap]kernel.CallInfo{}
	c.decided, c.over, c.fired = false, false, false
	c.resp, c.err = nil, nil
	c.charged, c.allowed, c.refunded = false, false, false
	c.panicked, c.panicVal = false, nil
}

// run makes attempt i and reports its outcome. An attempt that panics
// (or exits its goroutine) decides the call, if undecided, with the panic,
// which hedged raises again on the caller's goroutine once every attempt
// has returned: a hedge's own goroutine must not take the process down,
// and the caller must not return while attempts still use info and req.
func (c *call) run(i int) {
	start := time.Now()
	returned := false
	defer func() {
		if !returned {
			c.aborted(i, recover())
		}
	}()
	ctx, n := c.f.nested(c.ctx)
	resp, err := c.next(ctx, &c.cis[i], c.req)
	returned = true
	if c.tr != nil {
		// A loser's latency is the time until it was cancelled: at least
		// the delay, so it still counts as a slow one.
		c.tr.observe(time.Since(start))
	}
	c.finished(i, resp, err, n)
}

// hedge runs attempt i on its own goroutine.
func (c *call) hedge(i int) {
	defer c.wg.Done()
	c.run(i)
}

// fire starts the next attempt once the delay has passed, if the call is
// still undecided and the budget pays for it.
func (c *call) fire() {
	c.mu.Lock()
	c.fired = true
	if c.decided || c.over || c.launched >= c.f.maxAttempts || c.ctx.Err() != nil || c.pastDeadline() {
		c.mu.Unlock()
		return
	}
	if !c.f.budget.Spend() {
		c.f.unpaid.Add(1)
		c.mu.Unlock()
		c.f.debug(c.ctx, "not hedging: the budget is spent", c.method, c.launched+1)
		return
	}
	i := c.launchLocked()
	if c.launched < c.f.maxAttempts {
		c.f.arm(c, c.delay)
	}
	c.mu.Unlock()
	go c.hedge(i)
}

// pastDeadline reports whether the call's deadline has passed, which
// c.ctx's Err may not say yet: the engine's in-place deadline
// (client.timeout, the timeout filter) ends the contexts derived from the
// call's on a goroutine of its own, and a hedge due at about the deadline
// (a delay observed from calls that ran out of it) can fire first. Sent,
// it could only fail, yet it would spend a token of the budget and could
// decide the call with its own error.
func (c *call) pastDeadline() bool { return pastDeadline(c.ctx) }

// pastDeadline reports whether ctx's deadline has passed, whatever its
// Err says yet.
func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// launchLocked prepares the next attempt; its caller starts it.
func (c *call) launchLocked() int {
	i := c.launched
	c.cis[i] = c.base
	if c.base.Metadata != nil {
		c.cis[i].Metadata = c.base.Metadata.Clone()
	}
	c.launched++
	c.pending++
	c.wg.Add(1)
	c.f.hedges.Add(1)
	return i
}

// finished takes attempt i's outcome: the first success decides the call,
// as does a final failure; a retryable one starts the next attempt at
// once if the budget allows, and decides the call if it was the last.
// n is what a budget-keeping filter the attempt ran in reported, if any.
func (c *call) finished(i int, resp any, err error, n *retrybudget.Nested) {
	c.mu.Lock()
	c.pending--
	if c.decided {
		c.mu.Unlock()
		return // a loser: cancelled, or too late
	}
	switch {
	case err == nil:
		n.Succeeded(c.f.budget)
		c.charged, c.allowed, c.refunded = false, false, true
		c.decideLocked(i, resp, nil)
	case c.ctx.Err() != nil || !c.f.retryable(err):
		c.charged, c.allowed = n.Said()
		c.decideLocked(i, nil, err)
	default:
		// Past the call's deadline, which c.ctx may not say yet (see
		// pastDeadline), the failure is the call's ending, as when c.ctx
		// ended: it pays for no next attempt, which could only fail.
		again := false
		if c.pastDeadline() {
			c.charged, c.allowed = n.Said()
		} else {
			again = n.Failed(c.f.budget)
			c.charged, c.allowed = true, again
		}
		if again && c.launched < c.f.maxAttempts && !c.over {
			j := c.launchLocked()
			c.mu.Unlock()
			go c.hedge(j)
			return
		}
		if c.pending == 0 {
			c.decideLocked(i, nil, err)
		}
	}
	c.mu.Unlock()
}

// aborted takes attempt i's panic p (nil: it exited its goroutine): the
// call's outcome if it was undecided; otherwise, that of a loser, logged.
func (c *call) aborted(i int, p any) {
	what := fmt.Sprintf("panicked: %v", p)
	if p == nil {
		what = "exited its goroutine (runtime.Goexit)"
	}
	err := &kernel.Status{Code: kernel.Internal, Message: fmt.Sprintf("hedge: attempt %d of %s %s", i+1, c.method, what)}
	c.mu.Lock()
	c.pending--
	if !c.decided {
		c.panicked, c.panicVal = p != nil, p
		c.decideLocked(i, nil, err)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.f.log.Error("hedge: an attempt that had lost "+what, "method", c.method, "attempt", i+1)
}

// decideLocked ends the call with attempt i's outcome and cancels the
// other attempts.
func (c *call) decideLocked(i int, resp any, err error) {
	c.decided, c.winner, c.resp, c.err = true, i, resp, err
	c.cancel()
	c.done <- struct{}{}
}
