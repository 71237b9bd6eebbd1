package kernrpc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// callCtx is the context a server handler runs under. It is one allocation
// per call (context.WithCancel plus WithValue plus WithDeadline would be
// three to five) and is cancelled when the client cancels, its deadline
// passes, or the connection dies. Its deadline is timed only once somebody
// asks for Done: until then Err reads the clock, so that a call with a
// deadline whose handler never waits on its context costs no timer.
type callCtx struct {
	parent   context.Context
	mu       sync.Mutex
	done     chan struct{} // created on first Done
	err      error
	deadline time.Time   // the client's, or the one a Deadliner gave
	timer    *time.Timer // started by the first Done, for deadline
	// timeout and timeoutBy are the deadline a Deadliner gave, and its
	// filter's name; timeoutBy is empty when the client sent the deadline.
	timeout   time.Duration
	timeoutBy string
	// arrived is when serving began (monoNow), if a clock was read for it
	// anyway; 0 if not.
	arrived time.Duration

	id      uint64
	refused bool // arrived while the server was draining: answered, not served
	handled bool // went through the filters' Invoke: its status is not Retryable
	sc      *serverConn
	desc    *methodDesc
	req     any           // the request to decode into, made with the call (methodDesc.newCall); nil for a stream
	stream  *ServerStream // set for a stream, under sc.mu
	info    kernel.CallInfo
	out     kernel.Frame // the response frame, kept here so sending it does not allocate
	// vals are the first answers ContextValuers gave: written under mu,
	// read up to nvals without it.
	vals  [2]keyValue
	nvals atomic.Int32
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *callCtx) Deadline() (time.Time, bool) {
	if c.deadline.IsZero() {
		return c.parent.Deadline()
	}
	return c.deadline, true
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.expireLocked()
		if c.err != nil {
			c.done = closedChan
		} else {
			c.done = make(chan struct{})
			if !c.deadline.IsZero() && c.timer == nil {
				c.timer = time.AfterFunc(time.Until(c.deadline), c.expire)
			}
		}
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
	return c.err
}

// stopTimer stops the deadline's timer, if it was started.
func (c *callCtx) stopTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}

// expire ends the context at its deadline, from its timer.
func (c *callCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
}

// expireLocked ends the context if its deadline has passed.
func (c *callCtx) expireLocked() {
	if c.err == nil && !c.deadline.IsZero() && time.Until(c.deadline) <= 0 {
		c.cancelLocked(context.DeadlineExceeded)
	}
}

type callInfoKey struct{}

func (c *callCtx) Value(key any) any {
	switch key {
	case callInfoKey{}:
		return &c.info
	case serverStreamKey{}:
		if c.stream != nil {
			return c.stream
		}
	}
	if c.desc != nil && len(c.desc.valuers) > 0 {
		if val, ok := c.callValue(key); ok {
			return val
		}
	}
	return c.parent.Value(key)
}

// callValue asks the method's ContextValuers for key, keeping the first
// answers: a value made for the call (a span from its metadata) is then
// made once, however many of the handler's calls look it up. Kept answers
// are read without a lock: an entry is written before nvals counts it.
func (c *callCtx) callValue(key any) (any, bool) {
	n := c.nvals.Load()
	for i := range n {
		if kv := &c.vals[i]; kv.key == key {
			return kv.val, true
		}
	}
	for _, v := range c.desc.valuers {
		if val, ok := v.CallValue(&c.info, key); ok {
			c.keep(key, val)
			return val, true
		}
	}
	return nil, false
}

// keep adds an answer to the kept ones, if there is room and no other
// goroutine kept one for key meanwhile.
func (c *callCtx) keep(key, val any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nvals.Load()
	if int(n) == len(c.vals) {
		return
	}
	for i := range n {
		if c.vals[i].key == key {
			return
		}
	}
	c.vals[n] = keyValue{key, val}
	c.nvals.Store(n + 1)
}

// keyValue is one answer of a ContextValuer.
type keyValue struct{ key, val any }

func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelLocked(err)
}

func (c *callCtx) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	} else {
		c.done = closedChan
	}
}

// CallInfoFrom returns the call a server handler is serving (its method,
// peer, codec and metadata), or nil outside a handler. A handler may set
// response metadata through it.
func CallInfoFrom(ctx context.Context) *kernel.CallInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*kernel.CallInfo)
	return ci
}

// IncomingMetadata returns the metadata the client sent with the call a
// handler is serving.
func IncomingMetadata(ctx context.Context) kernel.Metadata {
	if ci := CallInfoFrom(ctx); ci != nil {
		return ci.Metadata
	}
	return nil
}

// deadlineAfter is the deadline d after the call arrived: from the clock
// read as serving began, if there was one, else from now.
func (c *callCtx) deadlineAfter(d time.Duration) time.Time {
	if c.arrived > 0 {
		return deadlineFrom(c.arrived, d)
	}
	return deadlineIn(d)
}
