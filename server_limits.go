package kernrpc

import (
	"errors"
	"strconv"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The server's limits on what one client can make it hold or do; see
// docs/reliability.md for each, with its default and its test.

// replayWindow is how many of the latest call ids a connection remembers.
// A client numbers its calls upward on each connection, so an id seen
// before is a frame sent twice (a buggy proxy, a replay): it is dropped,
// never run again. The window is far above max_concurrent_calls by
// default, but a call can still fall out of it (more calls in flight, or
// a caller stalled between numbering and writing its request): an id older
// than the window is refused unprocessed, so that it is retried rather
// than left unanswered, unless its call still runs (then it is a copy).
const replayWindow = 4096

// callIDWindow is a sliding bitmap of the call ids seen on a connection.
type callIDWindow struct {
	latest uint64
	seen   [replayWindow / 64]uint64
}

// admit records id and reports whether it was new. An id older than the
// window is not new, and late says so: it may be a replay, or a request
// that 4096 later ones overtook, which nobody has answered.
func (w *callIDWindow) admit(id uint64) (fresh, late bool) {
	switch {
	case id > w.latest:
		if id-w.latest >= replayWindow {
			w.seen = [replayWindow / 64]uint64{}
		} else {
			// Counted up to id, not while i <= id: i <= 1<<64-1 holds
			// for every i, and the loop would never end.
			for i := w.latest; i != id; {
				i++
				w.seen[(i%replayWindow)/64] &^= 1 << (i % 64)
			}
		}
		w.latest = id
	case w.latest-id >= replayWindow:
		return false, true
	case w.seen[(id%replayWindow)/64]&(1<<(id%64)) != 0:
		return false, false
	}
	w.seen[(id%replayWindow)/64] |= 1 << (id % 64)
	return true, false
}

// refuseLate answers, unprocessed, a request whose id is older than the
// replay window and whose call does not run: it may be a replay, so it is
// not run, but a late request nobody answered must not wait for ever. A
// replay's answer goes to an id its client no longer waits on, which
// drops it. ResourceExhausted, as for too many calls in flight, since the
// connection still serves: a retryable Unavailable would tell the client
// the server is going away.
func (sc *serverConn) refuseLate(id uint64) {
	sc.answerUnprocessed(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream | kernel.FlagRetryable, CallID: id, Code: kernel.ResourceExhausted,
		Message: "the call id is " + strconv.Itoa(replayWindow) + " or more below the highest this connection carried, so the server cannot tell it from a replay; the call was not processed"})
}

// refuseOverLimit answers a request over max_concurrent_calls at once,
// unprocessed, so that the client may send it elsewhere. Not under sc.mu:
// a transport without a queue (shm-ring) may wait for room to write.
func (sc *serverConn) refuseOverLimit(id uint64) {
	max := sc.srv.cfg.Server.MaxConcurrentCalls
	sc.answerUnprocessed(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream | kernel.FlagRetryable, CallID: id, Code: kernel.ResourceExhausted,
		Message: "the connection already has " + strconv.Itoa(max) + " calls in flight, the server's server.max_concurrent_calls; the call was not processed"})
}

// answerUnprocessed sends f, the read loop's answer to a call it refused
// unprocessed. Refused alone (shm-ring: the client read nothing for
// wait_timeout), it would leave that call waiting in vain on a connection
// that lives on, since nothing sends it again: the connection is closed
// instead, as for a refused answer of a call served (closeUnanswered), so
// that the client learns at once.
func (sc *serverConn) answerUnprocessed(f *kernel.Frame) {
	err := sc.send(f)
	if err == nil {
		return
	}
	var st *kernel.Status
	if !errors.As(err, &st) || sc.conn.Err() != nil {
		sc.srv.log.Debug("frame not sent: connection gone", "type", f.Type, "call_id", f.CallID, "err", err)
		return
	}
	sc.srv.log.Warn("refusal of a call not sent; closing the connection so that the client learns at once", "call_id", f.CallID, "peer", sc.conn.RemoteAddr(), "err", err)
	_ = sc.conn.Close()
}

// noteReplay logs the first dropped duplicate of a connection: one line
// tells the operator, a flood of them would only fill the log.
func (sc *serverConn) noteReplay(id uint64) {
	if sc.replayLogged.CompareAndSwap(false, true) {
		sc.srv.log.Warn("dropping a request whose call id was already used on this connection (a duplicated or replayed frame); later ones are dropped silently",
			"call_id", id, "peer", sc.conn.RemoteAddr())
	}
}

// idleWatch closes the connection once it has carried no call for a whole
// idle_timeout period (so after one to two periods of silence): it drains
// it as a shutdown does (endIdle), then closes it.
// It costs the call path nothing: the latest call id seen tells whether
// calls came since the last tick.
type idleWatch struct {
	timer *time.Timer
	seen  uint64 // the latest call id at the last tick (the timer's goroutine only)
}

func (sc *serverConn) startIdleWatch() {
	sc.idle.timer = time.AfterFunc(sc.srv.cfg.Server.IdleTimeout.D(), sc.idleTick)
}

func (sc *serverConn) idleTick() {
	sc.mu.Lock()
	now := sc.ids.latest
	busy := len(sc.calls) > 0 || now != sc.idle.seen
	ended := sc.goingAway // its GoAways are out: close it once idle
	over := sc.closed || sc.drain != drainNone && !ended
	if !busy && !over {
		sc.goingAway = true
	}
	sc.mu.Unlock()
	sc.idle.seen = now
	switch {
	case over:
		return
	case busy:
		sc.idle.timer.Reset(sc.srv.cfg.Server.IdleTimeout.D())
		return
	case ended:
		sc.srv.closeConn(sc.srv.baseCtx, sc, time.Now().Add(closeGrace))
		return
	}
	sc.srv.log.Debug("closing an idle connection", "peer", sc.conn.RemoteAddr(), "idle_timeout", sc.srv.cfg.Server.IdleTimeout)
	sc.endIdle()
}

// maxConnectionsReason is the GoAway's reason on a connection refused
// for server.max_connections.
const maxConnectionsReason = "max_connections"

// refusingMax bounds the refused connections told why at once: past it,
// in a flood, one is closed as it is accepted, telling it nothing.
const refusingMax = 64

// refuseConn ends a connection accepted over max_connections. It tells
// the client why, with a GoAway naming no call served, so that what it
// sent is known unprocessed (retryable elsewhere) rather than lost with
// the connection; then it half-closes and gives the client closeGrace to
// close its side, so that the request already on its way does not turn
// the close into a reset that destroys the GoAway unread.
func (s *Server) refuseConn(c kernel.Conn) {
	if s.refusing.Add(1) > refusingMax {
		s.refusing.Add(-1)
		_ = c.Close()
		return
	}
	s.refusals.Go(func() {
		defer s.refusing.Add(-1)
		_ = queueFrame(c, &kernel.Frame{Type: kernel.FrameGoAway, CallID: 0, Message: maxConnectionsReason})
		if hc, ok := c.(kernel.HalfCloser); ok && hc.CloseWrite() == nil {
			grace := time.NewTimer(closeGrace)
			select {
			case <-c.Done():
			case <-grace.C:
			case <-s.baseCtx.Done():
			}
			grace.Stop()
		}
		_ = c.Close()
	})
}

// admitConnLocked reports whether the server may hold one more connection; a
// refused one is logged at most once a second, with how many were refused.
func (s *Server) admitConnLocked() bool {
	if len(s.conns) < s.cfg.Server.MaxConnections {
		return true
	}
	n := s.refusedConns.Add(1)
	now := time.Now().UnixNano()
	if last := s.refusedLogged.Load(); now-last >= int64(time.Second) && s.refusedLogged.CompareAndSwap(last, now) {
		s.log.Warn("refusing connections: the server holds server.max_connections already", "max_connections", s.cfg.Server.MaxConnections, "refused_so_far", n)
	}
	return false
}
