package kernrpc

import (
	"context"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// How a shutting-down server ends its connections without refusing a call
// the client had sent before it heard. A GoAway naming the last call
// served races the requests already on their way: those arrive above it
// and are refused. A unary call refused so is simply sent again, but a
// stream's opener has been told it is open, and its caller may have sent
// messages: it would end in an error. So the server drains in two steps,
// as HTTP/2 servers do with their two GOAWAY frames:
//
//  1. It sends a GoAway with call id kernel.GoAwayUnknownLast: send
//     nothing new here, and everything sent so far will be served. The
//     client stops picking the connection and answers with a GoAway of its
//     own whose call id is how many requests it sent on the connection:
//     the ones it numbered (kernrpc numbers them 1, 2, 3, ...), less any
//     its transport refused whole.
//  2. Once that GoAway and that many requests have arrived, nothing more
//     will. A client that does not answer within drainAckWait (or the
//     shutdown's deadline) gets a second GoAway, naming the last call
//     served, and what arrives later is refused as retryable.

// drainAckWait bounds how long a shutdown waits for clients to answer its
// first GoAway.
const drainAckWait = time.Second

// Where a connection is in its server's shutdown.
const (
	drainNone     = iota // serving
	drainAsked           // the first GoAway is out; requests are still served
	drainRefusing        // requests are refused as retryable
)

// drainConns runs a shutdown's two steps on conns, then waits for the
// calls in flight until ctx ends. A client with calls in flight reads, and
// answers the first GoAway at once; so does a kernrpc client whose
// connection idled long enough to have its own reader (clientconn_idle.go).
// One idle for less reads it with the answer to its next call or when its
// reader starts, so the wait (drainAckWait at most) also serves a call an
// idle client makes as the shutdown begins.
func (s *Server) drainConns(ctx context.Context, conns []*serverConn) error {
	for _, sc := range conns {
		sc.askToDrain("") // one ending for its idleness has asked already
	}
	unanswered := awaitDrained(ctx, conns)
	for _, sc := range conns {
		sc.refuseNew("")
	}
	// unanswered says why a shutdown took a second longer: clients that
	// read only when they call (another engine's, or a kernrpc client
	// that made a single call) and are now refused what they send.
	s.log.Info("shutting down: draining in-flight calls", "in_flight", s.inflight.Load(), "connections", len(conns), "unanswered", unanswered)
	return s.waitInFlight(ctx)
}

// askToDrain sends the first GoAway, saying why (reason: empty for a
// shutdown, idleTimeoutReason), unless one was sent already: then it
// reports false.
func (sc *serverConn) askToDrain(reason string) bool {
	sc.mu.Lock()
	if sc.drain != drainNone {
		sc.mu.Unlock()
		return false
	}
	sc.drain = drainAsked
	sc.drained = make(chan struct{})
	sc.checkDrainedLocked()
	sc.mu.Unlock()
	sc.queue(&kernel.Frame{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast, Message: reason})
	return true
}

// clientGoingAway takes in the client's GoAway: it sends no more than
// count requests on this connection.
func (sc *serverConn) clientGoingAway(count uint64) {
	sc.mu.Lock()
	sc.clientDone, sc.clientCount = true, count
	sc.checkDrainedLocked()
	sc.mu.Unlock()
}

// checkDrainedLocked closes drained once nothing more can arrive: the
// client said how many requests it sent and they are all in, or the
// connection is closed. sc.mu is held.
func (sc *serverConn) checkDrainedLocked() {
	if sc.drain != drainAsked || sc.drainedClosed {
		return
	}
	if sc.closed || sc.clientDone && sc.received >= sc.clientCount {
		sc.drainedClosed = true
		close(sc.drained)
	}
}

// refuseNew ends the first step: from now on requests are refused. A
// connection whose client has not said it stopped gets the GoAway naming
// the last call served, so that it sends the later ones elsewhere.
func (sc *serverConn) refuseNew(reason string) {
	sc.mu.Lock()
	if sc.drain == drainRefusing {
		sc.mu.Unlock()
		return
	}
	done := sc.drainedClosed
	if sc.drain == drainAsked && !done {
		// Nothing is waited for any more: what arrives now is refused. A
		// shutdown that begins after an idle drain came this far must not
		// wait for an answer the connection has stopped waiting for.
		sc.drainedClosed = true
		close(sc.drained)
	}
	sc.drain = drainRefusing
	last := sc.lastAccepted
	sc.mu.Unlock()
	if !done {
		sc.queue(&kernel.Frame{Type: kernel.FrameGoAway, CallID: last, Message: reason})
	}
}

// refusesLocked reports whether a request arriving now is refused rather
// than served. sc.mu is held. Until it is asked to drain, a connection
// serves: no connection joins once the server drains, so a shutdown asks
// every one.
func (sc *serverConn) refusesLocked() bool {
	return sc.drain == drainRefusing
}

// endIdle ends a connection that carried no call for idle_timeout, in the
// same two steps: a call or stream the client sent as the first GoAway
// left is served, and the connection is closed once it is idle again.
func (sc *serverConn) endIdle() {
	if !sc.askToDrain(idleTimeoutReason) {
		return // the shutdown has it
	}
	wait := time.NewTimer(drainAckWait)
	select {
	case <-sc.drained:
	case <-wait.C:
	case <-sc.srv.baseCtx.Done():
	}
	wait.Stop()
	sc.refuseNew(idleTimeoutReason) // names the last call served, unless the client answered
	sc.mu.Lock()
	calls := len(sc.calls) > 0
	sc.mu.Unlock()
	if calls {
		// Served because they raced the GoAway: the next idle tick closes
		// the connection, unless the client, draining, closes it first.
		sc.idle.timer.Reset(sc.srv.cfg.Server.IdleTimeout.D())
		return
	}
	sc.srv.closeConn(sc.srv.baseCtx, sc, time.Now().Add(closeGrace))
}

// awaitDrained waits until each of conns has its client's answer and the
// requests it counts, or drainAckWait or ctx ends the wait, and reports
// how many of conns were still waited for.
func awaitDrained(ctx context.Context, conns []*serverConn) int {
	if len(conns) == 0 {
		return 0
	}
	wait := time.NewTimer(drainAckWait)
	defer wait.Stop()
waiting:
	for _, sc := range conns {
		select {
		case <-sc.drained:
		case <-wait.C:
			break waiting
		case <-ctx.Done():
			break waiting
		}
	}
	n := 0
	for _, sc := range conns {
		select {
		case <-sc.drained:
		default:
			n++
		}
	}
	return n
}
