package kernrpc

import (
	"context"
	"time"
)

// Reading for an idle connection. A connection has no reader goroutine:
// its callers take turns reading (clientConn). One that carries no call
// reads nothing, so a server's GoAway (a shutdown, or idle_timeout) lay
// unread until the next call, and the server, which waits for the
// client's answer before it stops serving, waited a second for it
// (drainAckWait) and another for the client to close (closeGrace). So a
// connection that carried no call for a whole idleReadAfter gets a reader
// of its own: it answers a GoAway at once, and then closes the connection.
// The next call cancels it and reads for itself again, so a busy
// connection keeps its lone-caller path.
//
// One timer per client looks at all its connections every idleReadAfter:
// 30 µs for 2,000 connections. A timer per connection did the same at 2 µs
// a tick (a goroutine each), 4% of a core for 2,000 busy connections.

// idleReadAfter is how often a client looks for connections that carried
// no call since it last looked. A shutdown then waits at most about twice
// that for an idle client's answer.
const idleReadAfter = 100 * time.Millisecond

// idleReading is a connection's idle reader; guarded by the connection's
// mu.
type idleReading struct {
	// seen is the connection's nextID when the client last looked;
	// unlooked at first, so that a connection dialled for a call is not
	// read before that call has numbered its request.
	seen   uint64
	reader *attempt // holds (or waits for) the reader role while one runs
	stop   context.CancelFunc
}

// unlooked is idleReading.seen before the client first looked.
const unlooked = ^uint64(0)

// startIdleSweep starts the looks for idle connections, unless they run
// or c is closed. A connection's second request starts them, or a stream:
// a client made for one call (connect, call, close) never needs them, and
// starting them cost it 30-35 µs of CPU, a tenth of a 16 B short call
// (4.4-4.5k against 3.9k calls/s; a goroutine for the looks, instead of
// a timer, 3.2k). A client that makes one call and then idles is read by
// nobody, as before.
func (c *Client) startIdleSweep() {
	if c.sweep.Load() != nil {
		return // every stream opened asks: most find the looks running
	}
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	if c.sweep.Load() == nil && !c.closed.Load() {
		c.sweep.Store(time.AfterFunc(idleReadAfter, c.sweepIdle))
	}
}

// sweepIdle looks at every connection of c, then again idleReadAfter
// later, until c closes.
func (c *Client) sweepIdle() {
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	if c.closed.Load() {
		return
	}
	for _, p := range *c.pools.Load() {
		p.mu.Lock()
		for _, cc := range p.conns {
			if cc != nil {
				cc.lookIdle()
			}
		}
		p.mu.Unlock()
	}
	c.sweep.Load().Reset(idleReadAfter)
}

// stopIdleSweep stops the looks, waiting out one in progress.
func (c *Client) stopIdleSweep() {
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	if t := c.sweep.Load(); t != nil {
		t.Stop()
	}
}

// lookIdle starts an idle reader if cc numbered no request since the last
// look and nobody reads it.
func (cc *clientConn) lookIdle() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	switch {
	case cc.dead != nil || cc.idle.reader != nil:
	case cc.nextID != cc.idle.seen || cc.reader != nil || len(cc.pending) > 0 || len(cc.streams) > 0:
		cc.idle.seen = cc.nextID
	default:
		ctx, stop := context.WithCancel(context.Background())
		me := &attempt{wake: make(chan struct{}, 1)}
		cc.idle.reader, cc.idle.stop = me, stop
		cc.reader = me
		go cc.readIdle(ctx, me)
	}
}

// readIdle reads for cc until a call stops it (stopIdleReadLocked) or the
// connection ends.
func (cc *clientConn) readIdle(ctx context.Context, me *attempt) {
	cc.readFor(ctx, me) // its own answer never comes: it returns having passed the role on
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.stopIdleReadLocked()
	cc.idle.reader = nil
	cc.idle.seen = unlooked
}

// stopIdleReadLocked cancels the idle reader's read, if one runs: a
// request is about to be sent, and its caller reads for itself. cc.mu is
// held.
func (cc *clientConn) stopIdleReadLocked() {
	if cc.idle.stop != nil {
		cc.idle.stop()
		cc.idle.stop = nil
	}
}

// unreadLocked reports whether nobody but the idle reader reads cc, which
// may then close. cc.mu is held.
func (cc *clientConn) unreadLocked() bool {
	return cc.reader == nil || cc.reader == cc.idle.reader
}
