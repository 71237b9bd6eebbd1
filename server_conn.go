package kernrpc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// methodDesc is one registered method: how to decode its requests, its
// chain, and how slow its calls have lately been.
type methodDesc struct {
	// newCall makes a unary call's context and the request it decodes
	// into: in one allocation for Handle's (callWith), in two for
	// Register's, whose request type is known only to its newRequest.
	newCall func() (*callCtx, any)
	// freshRequests says newCall's requests are zero values made for the
	// call (Handle's), which a kernel.FreshUnmarshaler need not clear.
	freshRequests bool
	stream        *streamMethod // set for a streaming method, which has no newCall
	// invoke runs the filters that apply to the method around its handler,
	// and admit are those of them that decide before the request is
	// decoded; both are built at Start, once every method and filter is
	// known.
	invoke kernel.Invoker
	admit  []kernel.Admitter
	// deadliners give a call the client sent no deadline one
	// (kernel.Deadliner).
	deadliners []configuredFilter
	// observe are told of every call once it is answered, valuers asked
	// for the handler context's values (kernel.CallObserver,
	// kernel.ContextValuer).
	observe []kernel.CallObserver
	valuers []kernel.ContextValuer
	// slowCalls counts down the calls still to be served off the reader
	// since the method proved slow; overBudget is its score of slow calls
	// (see noteBurstCall).
	slowCalls  atomic.Int32
	overBudget atomic.Int32
}

// noteBurstCall learns from how long a call served inline in a burst took:
// a slow call raises the method's score, a quick one lowers it, so a method
// whose calls are mostly slow gets there even if quick ones (cancelled or
// failing early, say) come between.
func (d *methodDesc) noteBurstCall(took time.Duration) {
	if took <= burstBudget {
		for n := d.overBudget.Load(); n > 0 && !d.overBudget.CompareAndSwap(n, n-1); n = d.overBudget.Load() {
		}
		return
	}
	d.noteSlowCall()
}

// noteSlowCall counts one slow call of d; enough of them make d slow.
func (d *methodDesc) noteSlowCall() {
	if d.overBudget.Add(1) >= overBudgetStreak {
		d.overBudget.Store(0)
		d.slowCalls.Store(slowMethodCalls)
	}
}

// latelySlow reports whether a call of d should be served off the reader.
// A nil d (unknown method) is answered at once, so it is served inline.
func (d *methodDesc) latelySlow() bool {
	if d == nil || d.slowCalls.Load() <= 0 {
		return false
	}
	d.slowCalls.Add(-1)
	return true
}

// NewServer builds a server from cfg: it looks up every plugin by name and

// serverConn is one client connection on the server side.
type serverConn struct {
	srv  *Server
	conn kernel.Conn

	readState     atomic.Int32  // reading, servingInline or handedOff
	inlineSeq     atomic.Uint64 // counts calls served inline
	inlineDesc    atomic.Pointer[methodDesc]
	watchdog      atomic.Pointer[time.Timer] // made by the first inline call
	watchdogArmed atomic.Bool
	watchedSeq    uint64 // inlineSeq at the watchdog's last tick; only watch touches it

	idle         idleWatch
	replayLogged atomic.Bool
	flow         *connFlow // made by the first stream frame; see connFlow

	mu        sync.Mutex
	calls     map[uint64]*callCtx
	ids       callIDWindow // the call ids seen, so that none runs twice
	closed    bool
	goingAway bool // idle: its end has begun (endIdle)
	// lastAccepted is the highest call id accepted for serving. Once the
	// server drains, no higher id is served, and the GoAway says so: the
	// client may then safely resend any higher-numbered call.
	lastAccepted uint64
	// A shutdown's two steps (server_drain.go): drain says which step;
	// received counts the distinct requests read; clientCount is how many
	// the client's GoAway says it sent; drained closes once they are in,
	// or once the second step stops waiting for them.
	drain         int
	received      uint64
	clientDone    bool
	clientCount   uint64
	drained       chan struct{}
	drainedClosed bool
	// goAwaysSent closes once a shutdown's GoAways are written, or could
	// not be (drainConns); nil until it drains.
	goAwaysSent chan struct{}
}

// idleTimeoutReason is the GoAway's reason when a connection idled for
// server.idle_timeout.
const idleTimeoutReason = "idle_timeout"

// readLoop reads frames until the connection dies. A request is served by
// the goroutine that read it, which is already running, so it costs no
// hand-off: a lone caller costs the server no goroutine creation and no
// wake-up per call. When more requests are already buffered (a burst),
// they are served one after another on the same goroutine and their
// answers queued, so the burst is answered in one write. A method that has
// lately been slow (it outran the watchdog, or burstBudget in a burst) is
// served on its own goroutine after starting a new reader, so that it
// holds nobody up; and a watchdog hands the reading to a new goroutine if
// an inline call runs long.
func (sc *serverConn) readLoop() {
	for {
		f, err := sc.conn.ReadFrame(context.Background())
		if err != nil {
			sc.close(err)
			return
		}
		sc.srv.headroom.noteFrame(len(f.Payload))
		switch f.Type {
		case kernel.FrameRequest:
			desc := sc.srv.methods[f.Method]
			c := sc.begin(f, desc)
			if c == nil {
				f.Release()
				continue
			}
			if f.Flags&kernel.FlagStream != 0 || desc != nil && desc.stream != nil {
				sc.openStream(c, f, desc)
				continue
			}
			if desc.latelySlow() {
				go sc.readLoop()
				sc.serve(c, f, false)
				return
			}
			if !sc.serveInline(c, f, desc, sc.moreWaiting()) {
				return
			}
			continue
		case kernel.FrameCancel:
			sc.mu.Lock()
			c := sc.calls[f.CallID]
			sc.mu.Unlock()
			if c != nil {
				c.cancel(cancelCause(f))
			}
		case kernel.FrameStreamData:
			sc.streamData(f)
			yieldToWoken(sc.conn)
			continue
		case kernel.FrameWindowUpdate:
			sc.windowUpdate(f)
			yieldToWoken(sc.conn)
		case kernel.FrameGoAway:
			// The client sends nothing more here; its calls still get
			// answers.
			sc.clientGoingAway(f.CallID)
		default:
			sc.srv.log.Debug("ignoring unexpected frame", "type", f.Type, "call_id", f.CallID, "peer", sc.conn.RemoteAddr())
		}
		f.Release()
	}
}

// cancelCause is what a Cancel frame ends a call's context with: the
// client says when it was its deadline that passed.
func cancelCause(f *kernel.Frame) error {
	if f.Code == kernel.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return context.Canceled
}

const (
	reading       = iota // the read loop holds the reading role
	servingInline        // the reader is serving a call; the watchdog may take over
	handedOff            // the watchdog took over: another goroutine reads now
)

// watchdogPeriod is how often a connection serving calls inline checks
// that the call it serves has not kept the connection unread for a whole
// period. An inline call blocks reading for at most two periods; after
// overBudgetStreak such calls in a row the method counts as slow and is
// served off the reader. (One late call may just have been descheduled.)
const watchdogPeriod = time.Millisecond

// burstBudget is the longest a call may take to be served inline while
// more requests of its connection wait behind it: below it, serving the
// burst on one goroutine and answering in one write beats spreading it
// over goroutines; above it, the waiting costs more than that saves.
const burstBudget = 50 * time.Microsecond

// overBudgetStreak is how far a method's score must climb (slow calls
// count up, quick ones down) before it counts as slow: one call
// descheduled or caught by the garbage collector says nothing about it.
const overBudgetStreak = 4

// slowMethodCalls is how many calls of a method that outran the watchdog
// are served off the reader before it is tried inline again.
const slowMethodCalls = 1024

func (sc *serverConn) moreWaiting() bool {
	b, ok := sc.conn.(kernel.BufferedReader)
	return ok && b.Buffered() > 0
}

// serveInline serves c on the reading goroutine and reports whether that
// goroutine still holds the reading role afterwards. The watchdog timer is
// not armed per call (a timer per call costs a netpoller wake-up each): it
// ticks while inline calls keep coming and lapses when they stop.
func (sc *serverConn) serveInline(c *callCtx, f *kernel.Frame, desc *methodDesc, burst bool) bool {
	sc.inlineSeq.Add(1)
	sc.inlineDesc.Store(desc)
	sc.readState.Store(servingInline)
	if !sc.watchdogArmed.Load() && sc.watchdogArmed.CompareAndSwap(false, true) {
		if t := sc.watchdog.Load(); t != nil {
			t.Reset(watchdogPeriod)
		} else {
			// Stopped until stored, so that watch always finds it.
			t = time.AfterFunc(time.Hour, sc.watch)
			sc.watchdog.Store(t)
			t.Reset(watchdogPeriod)
		}
	}
	if !burst {
		sc.serve(c, f, false)
		return sc.readState.CompareAndSwap(servingInline, reading)
	}
	// In a burst the calls queued behind this one wait for it: a method
	// that takes longer than a few syscalls would save is served off the
	// reader from now on, in parallel.
	start := monoNow()
	c.arrived = start // so that run places a deadline without reading the clock again
	sc.serve(c, f, true)
	if desc != nil {
		desc.noteBurstCall(monoNow() - start)
	}
	return sc.readState.CompareAndSwap(servingInline, reading)
}

// watch runs on the timer's goroutine. If the same inline call is still
// running since the last tick, this goroutine takes over the reading.
func (sc *serverConn) watch() {
	seq := sc.inlineSeq.Load()
	if seq == sc.watchedSeq && sc.readState.Load() == servingInline &&
		sc.readState.CompareAndSwap(servingInline, handedOff) {
		if d := sc.inlineDesc.Load(); d != nil {
			d.noteSlowCall()
		}
		sc.watchdogArmed.Store(false)
		sc.readLoop()
		return
	}
	if seq == sc.watchedSeq {
		if h := watchLapseHook.Load(); h != nil {
			(*h)()
		}
		// No inline call for a whole period: let the watchdog lapse.
		sc.watchdogArmed.Store(false)
		// An inline call that began since seq was read may have found the
		// watchdog still armed and left it so: unless it arms it now, the
		// watchdog must go on watching it, or it could keep the connection
		// unread for as long as it runs.
		if sc.inlineSeq.Load() == seq || !sc.watchdogArmed.CompareAndSwap(false, true) {
			return
		}
	}
	sc.watchedSeq = seq
	sc.watchdog.Load().Reset(watchdogPeriod)
}

// watchLapseHook, set by tests only (export_test.go), runs as the watchdog
// is about to lapse: the race it widens is a preemption wide otherwise.
var watchLapseHook atomic.Pointer[func()]

// begin records a request so a Cancel can find it. A duplicate call id is a
// protocol error the client made: answer it without serving.
func (sc *serverConn) begin(f *kernel.Frame, desc *methodDesc) *callCtx {
	var c *callCtx
	if desc != nil && desc.newCall != nil {
		var req any
		c, req = desc.newCall()
		c.req = req
	} else {
		c = new(callCtx) // a stream's, or an unknown method's
	}
	c.parent, c.id, c.sc, c.desc = sc.srv.baseCtx, f.CallID, sc, desc
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return nil
	}
	// The window tells a duplicate, and an id older than it: a replay, or
	// a request that 4096 later ones overtook (a client with more calls
	// in flight than that, or one whose caller stalled between numbering
	// and writing it), which must not wait unanswered. Unless its call
	// still runs, it is refused unprocessed, and retried.
	fresh, late := sc.ids.admit(f.CallID)
	if late && sc.calls[f.CallID] == nil {
		sc.received++ // its client counted it in what it sent
		sc.checkDrainedLocked()
		sc.mu.Unlock()
		sc.refuseLate(f.CallID)
		return nil
	}
	if !fresh {
		sc.mu.Unlock()
		// Its first copy gets (or got) the call's one answer.
		sc.noteReplay(f.CallID)
		return nil
	}
	sc.received++
	sc.checkDrainedLocked()
	if len(sc.calls) >= sc.srv.cfg.Server.MaxConcurrentCalls {
		sc.mu.Unlock()
		sc.refuseOverLimit(f.CallID)
		return nil
	}
	sc.calls[f.CallID] = c
	// Checked under sc.mu, which refuseNew also takes: a call is either
	// counted in the GoAway or refused, never both.
	if sc.refusesLocked() {
		c.refused = true
	} else {
		sc.lastAccepted = max(sc.lastAccepted, f.CallID)
	}
	// Counted before sc.mu is let go: the request that completes the
	// client's count lets a shutdown past awaitDrained, and its
	// waitInFlight, which comes after refuseNew takes sc.mu, must see
	// this call, or the connection could close before it is answered.
	sc.srv.inflight.Add(1)
	sc.mu.Unlock()
	return c
}

func (sc *serverConn) end(c *callCtx) {
	c.stopTimer()
	sc.mu.Lock()
	delete(sc.calls, c.id)
	sc.mu.Unlock()
	c.cancel(context.Canceled)
	sc.srv.callEnded()
}

// queue sends f without writing on the caller's goroutine where the
// transport allows: the read loop and Shutdown use it, and neither may
// wait on a peer that does not read.
func (sc *serverConn) queue(f *kernel.Frame) {
	if err := sc.send(f); err != nil {
		sc.srv.log.Debug("frame not sent: connection gone", "type", f.Type, "call_id", f.CallID, "err", err)
	}
}

// close is called once the connection is dead: calls still running are
// cancelled, since nobody can receive their answers.
func (sc *serverConn) close(err error) {
	sc.mu.Lock()
	sc.closed = true
	sc.checkDrainedLocked()
	calls := make([]*callCtx, 0, len(sc.calls))
	for _, c := range sc.calls {
		calls = append(calls, c)
	}
	sc.mu.Unlock()
	for _, c := range calls {
		c.cancel(context.Canceled)
	}
	if t := sc.watchdog.Load(); t != nil {
		t.Stop()
	}
	sc.idle.timer.Stop()
	_ = sc.conn.Close()
	s := sc.srv
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
	if errors.Is(err, kernel.ErrClosed) || errors.Is(err, kernel.ErrPeerGone) || errors.Is(err, io.EOF) {
		s.log.Debug("connection closed", "peer", sc.conn.RemoteAddr(), "reason", err)
	} else {
		s.log.Warn("connection closed", "peer", sc.conn.RemoteAddr(), "reason", err)
	}
}
