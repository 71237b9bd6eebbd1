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
// The next call cancels it and reads for itself again: a busy connection
// keeps its lone-caller path, and pays a timer tick per idleReadAfter.

// idleReadAfter is how long a connection carries no call before a
// goroutine reads it. A shutdown then waits at most about twice that for
// an idle client's answer.
const idleReadAfter = 100 * time.Millisecond

// idleReading is a connection's idle reader and the ticks that start it;
// guarded by the connection's mu.
type idleReading struct {
	tick   *time.Timer
	seen   uint64   // the connection's nextID at the last tick
	reader *attempt // holds (or waits for) the reader role while one runs
	stop   context.CancelFunc
}

// watchIdle starts the ticks that look for cc carrying no call.
func (cc *clientConn) watchIdle() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.dead == nil {
		cc.idle.seen = cc.nextID
		cc.idle.tick = time.AfterFunc(idleReadAfter, cc.idleTick)
	}
}

// idleTick starts an idle reader if cc numbered no request since the last
// tick and nobody reads it; otherwise it looks again idleReadAfter later.
func (cc *clientConn) idleTick() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	switch {
	case cc.dead != nil:
	case cc.nextID != cc.idle.seen || cc.reader != nil || len(cc.pending) > 0 || len(cc.streams) > 0:
		cc.idle.seen = cc.nextID
		cc.idle.tick.Reset(idleReadAfter)
	default:
		ctx, stop := context.WithCancel(context.Background())
		me := &attempt{wake: make(chan struct{}, 1)}
		cc.idle.reader, cc.idle.stop = me, stop
		cc.reader = me
		go cc.readIdle(ctx, me)
	}
}

// readIdle reads for cc until a call stops it (stopIdleReadLocked) or the
// connection ends, then starts the ticks again.
func (cc *clientConn) readIdle(ctx context.Context, me *attempt) {
	cc.readFor(ctx, me) // its own answer never comes: it returns having passed the role on
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.stopIdleReadLocked()
	cc.idle.reader = nil
	if cc.dead == nil {
		cc.idle.seen = cc.nextID
		cc.idle.tick.Reset(idleReadAfter)
	}
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

// endIdleLocked stops the ticks of a connection that died or closed. An
// idle reader ends with the connection. cc.mu is held.
func (cc *clientConn) endIdleLocked() {
	if cc.idle.tick != nil {
		cc.idle.tick.Stop()
	}
}
