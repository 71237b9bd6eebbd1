package kernrpc

import (
	"context"
	"sync"
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
	// Each connection's two GoAways are written, in order, on a goroutine
	// of its own: a transport without a write queue (shm-ring) lets a
	// write wait up to its wait_timeout for room a client that stopped
	// reading never makes, and one connection after another, those waits
	// would add up far past ctx. closeConn waits for them, until ctx ends.
	goAways := make([]chan *kernel.Frame, len(conns))
	for i, sc := range conns {
		goAways[i] = make(chan *kernel.Frame, 2)
		if f := sc.askToDrain(""); f != nil { // nil: one ending for its idleness has asked already
			goAways[i] <- f
		}
		sc.sendGoAways(goAways[i])
	}
	unanswered := awaitDrained(ctx, conns)
	for i, sc := range conns {
		if f := sc.refuseNew(""); f != nil {
			goAways[i] <- f
		}
		close(goAways[i])
	}
	// unanswered says why a shutdown took a second longer: clients that
	// read only when they call (another engine's, or a kernrpc client
	// that made a single call) and are now refused what they send.
	s.log.Info("shutting down: draining in-flight calls", "in_flight", s.inflight.Load(), "connections", len(conns), "unanswered", unanswered)
	return s.waitInFlight(ctx)
}

// askToDrain begins the first step and returns its GoAway, for the
// caller to send, saying why (reason: empty for a shutdown,
// idleTimeoutReason); nil if the step had begun already.
func (sc *serverConn) askToDrain(reason string) *kernel.Frame {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.drain != drainNone {
		return nil
	}
	sc.drain = drainAsked
	sc.drained = make(chan struct{})
	sc.checkDrainedLocked()
	return &kernel.Frame{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast, Message: reason}
}

// sendGoAways writes frames, in order, on a goroutine of its own, and
// closes sc.goAwaysSent once they are written or failed to be.
func (sc *serverConn) sendGoAways(frames <-chan *kernel.Frame) {
	sent := make(chan struct{})
	sc.mu.Lock()
	sc.goAwaysSent = sent
	sc.mu.Unlock()
	go func() {
		defer close(sent)
		for f := range frames {
			sc.queue(f)
		}
	}()
}

// awaitGoAways waits until a shutdown's GoAways to sc are written, or ctx
// ends: a connection closed earlier would lose them.
func (sc *serverConn) awaitGoAways(ctx context.Context) {
	sc.mu.Lock()
	sent := sc.goAwaysSent
	sc.mu.Unlock()
	if sent == nil {
		return
	}
	select {
	case <-sent:
	case <-ctx.Done():
	}
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
// the last call served, so that it sends the later ones elsewhere:
// refuseNew returns it, for the caller to send, or nil.
func (sc *serverConn) refuseNew(reason string) *kernel.Frame {
	sc.mu.Lock()
	if sc.drain == drainRefusing {
		sc.mu.Unlock()
		return nil
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
	if done {
		return nil
	}
	return &kernel.Frame{Type: kernel.FrameGoAway, CallID: last, Message: reason}
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
	f := sc.askToDrain(idleTimeoutReason)
	if f == nil {
		return // the shutdown has it
	}
	sc.queue(f) // on the idle timer's goroutine: waiting here holds up no other
	wait := time.NewTimer(drainAckWait)
	select {
	case <-sc.drained:
	case <-wait.C:
	case <-sc.srv.baseCtx.Done():
	}
	wait.Stop()
	if f := sc.refuseNew(idleTimeoutReason); f != nil { // names the last call served, unless the client answered
		sc.queue(f)
	}
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

// closeConns ends the connections of a drained server. Where the transport
// can half-close, it does, and waits (briefly) for each client to close
// its side: a request already on its way is then read and left unserved
// rather than lost in a reset, and the client resends it elsewhere.
func (s *Server) closeConns(ctx context.Context) {
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	// One grace for them all, as a deadline: a timer's channel fires once,
	// and the connections after the first would wait for it forever. All
	// at once: closing one whose client does not read can take the
	// transport a while (tcp-lv: a second), and one after another, those
	// seconds would add up past ctx.
	graceEnd := time.Now().Add(closeGrace)
	var closing sync.WaitGroup
	for _, sc := range conns {
		closing.Go(func() { s.closeConn(ctx, sc, graceEnd) })
	}
	closing.Wait()
}

// closeConn ends one connection of a drained server or an idle one: where
// the transport can half-close, it does, and waits until the client
// closes its side, graceEnd passes or ctx ends. The half-close sends what
// is queued first, which a client that reads slowly receives while ctx
// lasts; one that does not read (or is dead) would hold it for as long as
// the transport lets a write wait (tcp-lv: write_timeout), so it is waited
// for only until ctx ends, and Close then cuts that write short. That
// half-close is waited for once more after Close (which ends it), so that
// no goroutine of the server outlives its Shutdown.
func (s *Server) closeConn(ctx context.Context, sc *serverConn, graceEnd time.Time) {
	sc.awaitGoAways(ctx)
	hc, ok := sc.conn.(kernel.HalfCloser)
	if !ok {
		_ = sc.conn.Close()
		return
	}
	shut := make(chan error, 1)
	go func() { shut <- hc.CloseWrite() }()
	var err error
	select {
	case err = <-shut:
		shut = nil
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		grace := time.NewTimer(time.Until(graceEnd))
		select {
		case <-sc.conn.Done():
		case <-grace.C:
		case <-ctx.Done():
		}
		grace.Stop()
	}
	_ = sc.conn.Close()
	if shut != nil {
		// Bounded all the same: a transport whose Close left CloseWrite
		// waiting must not hold the shutdown for good.
		wait := time.NewTimer(closeGrace)
		select {
		case <-shut:
		case <-wait.C:
		}
		wait.Stop()
	}
}

// closeGrace bounds how long a drained server waits for its clients to
// close their side of the connections.
const closeGrace = time.Second
