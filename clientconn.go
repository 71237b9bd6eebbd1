package kernrpc

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// clientConn multiplexes calls over one transport connection without a
// dedicated reader goroutine. The goroutines waiting for answers take turns
// reading (leader/follower): whoever waits while nobody reads becomes the
// reader, hands other callers their answers, and when its own answer
// arrives passes the reader role to another waiter. A lone caller therefore
// writes its request and reads its reply itself, with no goroutine hand-off
// at all, while 64 callers still share one connection. A connection with
// open streams, or one that carried no call for a while, has a goroutine
// of its own among the readers (streamReader, readIdle).
type clientConn struct {
	conn     kernel.Conn
	log      *lazyLogger
	headroom *headroomHold // the client's

	mu     sync.Mutex
	nextID uint64
	// unsent counts the ids numbered whose request the transport refused
	// alone, sending nothing: a GoAway's answer counts the requests sent
	// (nextID - unsent), and the server waits for as many.
	unsent   uint64
	pending  map[uint64]*attempt
	reader   *attempt // holds the reader role; nil when nobody reads
	waiters  waitList // waiting callers that could take the role
	draining bool     // GoAway received or pool retired: no new calls
	dead     error
	// goAwayLast is the last call id the server promised to serve, once it
	// sent GoAway; a pending call with a higher id was never served.
	goAway     bool
	goAwayLast uint64
	// goAwayWhy is the reason the server's GoAway gave, if any
	// (max_connections, idle_timeout, ...), for the calls it leaves
	// unserved.
	goAwayWhy string
	pool      *connPool
	// inflight is the load of the calls pending here, in bytes: each
	// charges its request and an answer the size of replyAvg, a moving
	// average of the answers read. The pool reads it, unlocked, to spread
	// large calls over connections (client.max_pool_size).
	inflight atomic.Int64
	replyAvg int64
	// spare is a connection dialled to spread load (a slot past
	// pool_size): its GoAway alone, as for its idleness, does not steer
	// calls away from an instance whose other connections serve.
	spare bool

	// streams are the streams open on the connection. While there are
	// any, a goroutine of the connection's own takes the reader role
	// whenever nobody else holds it (streamReader), so that their frames
	// are read even while no call waits; flow is their flow control.
	streams map[uint64]*ClientStream
	// streamsGen counts changes to streams (made under mu), so that a
	// reader may trust the stream it found last for as long as the count
	// has not moved (lastStream).
	streamsGen atomic.Uint64
	flow       *connFlow
	srRunning  bool
	srCtx      context.Context // ends when the last stream does
	srCancel   context.CancelFunc

	idle idleReading // reads while no call does (clientconn_idle.go)
}

// attempt is one attempt's bookkeeping on a connection, pooled so that it
// costs no allocation of its own.
type attempt struct {
	info kernel.CallInfo // what the attempt filters see
	req  kernel.Frame
	id   uint64
	wake chan struct{} // capacity 1: "your answer is in" or "you read now"
	resp *kernel.Frame
	err  error
	done bool

	prev, next *attempt // waitList links
	queued     bool

	charge int64 // what it adds to its connection's inflight
}

// begin clears what an earlier use of at left behind.
func (at *attempt) begin() {
	select {
	case <-at.wake:
	default:
	}
	at.id, at.resp, at.err, at.done = 0, nil, nil, false
}

func (at *attempt) signal() {
	select {
	case at.wake <- struct{}{}:
	default:
	}
}

// waitList is an intrusive list, so joining and leaving it allocates nothing.
type waitList struct{ head, tail *attempt }

func (l *waitList) push(at *attempt) {
	at.queued, at.prev, at.next = true, l.tail, nil
	if l.tail != nil {
		l.tail.next = at
	} else {
		l.head = at
	}
	l.tail = at
}

func (l *waitList) remove(at *attempt) {
	if !at.queued {
		return
	}
	if at.prev != nil {
		at.prev.next = at.next
	} else {
		l.head = at.next
	}
	if at.next != nil {
		at.next.prev = at.prev
	} else {
		l.tail = at.prev
	}
	at.queued, at.prev, at.next = false, nil, nil
}

// popLatest takes the most recent waiter: its stack and caches are warmest.
func (l *waitList) popLatest() *attempt {
	at := l.tail
	if at != nil {
		l.remove(at)
	}
	return at
}

func (cc *clientConn) usable() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.dead == nil && !cc.draining
}

// isOpen reports whether cc has not closed: it may take no new calls and
// still carry calls or streams.
func (cc *clientConn) isOpen() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.dead == nil
}

// retire lets the calls in flight finish, then closes.
func (cc *clientConn) retire() {
	cc.mu.Lock()
	cc.draining = true
	cc.closeIfIdleLocked()
	cc.mu.Unlock()
}

func (cc *clientConn) closeIfIdleLocked() {
	if cc.draining && cc.dead == nil && len(cc.pending) == 0 && len(cc.streams) == 0 && cc.unreadLocked() {
		cc.dead = errors.New("connection retired")
		go cc.conn.Close()
	}
}

// fail ends every pending call with Unavailable: the connection is gone and
// nobody will answer them.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.dead == nil {
		cc.dead = err
	}
	st := &kernel.Status{Code: kernel.Unavailable, Message: "connection to " + cc.conn.RemoteAddr() + " lost: " + err.Error()}
	why := ""
	if cc.goAwayWhy != "" {
		why = " (its GoAway said " + strconv.Quote(cc.goAwayWhy) + ")"
	}
	unserved := &kernel.Status{Code: kernel.Unavailable, Message: "server " + cc.conn.RemoteAddr() + " went away without serving the call" + why, Retryable: true}
	for _, at := range cc.pending {
		cc.dropLocked(at)
		at.err, at.done = st, true
		if cc.goAway && at.id > cc.goAwayLast {
			at.err = unserved
		}
		at.signal()
	}
	for at := cc.waiters.popLatest(); at != nil; at = cc.waiters.popLatest() {
		at.signal()
	}
	cc.reader = nil
	goAway, goAwayLast := cc.goAway, cc.goAwayLast
	streams := cc.streams
	cc.streams = nil
	cc.streamsGen.Add(1)
	if cc.pool != nil {
		cc.pool.client.streamsOpen.Add(-int64(len(streams)))
	}
	if cc.srCancel != nil {
		cc.srCancel()
	}
	cc.mu.Unlock()
	_ = cc.conn.Close()
	for id, cs := range streams {
		if goAway && id > goAwayLast {
			// The server said it would not open it: the stream can be
			// opened again, as a call is sent again.
			cs.lose(cc, id, &kernel.Status{Code: kernel.Unavailable, Message: "server " + cc.conn.RemoteAddr() + " went away without opening the stream of " + cs.info.Method + why, Retryable: true})
			continue
		}
		cs.lose(cc, id, &kernel.Status{Code: kernel.Unavailable, Message: "connection to " + cc.conn.RemoteAddr() + " lost while the stream of " + cs.info.Method + " was open: " + err.Error()})
	}
}

// leaveLocked takes at out of the waiters and, if it holds the reader
// role, hands the role on: at is about to return to its caller.
func (cc *clientConn) leaveLocked(at *attempt) {
	cc.waiters.remove(at)
	if cc.reader == at {
		cc.passReaderLocked()
	}
}

// dropLocked takes at off the pending calls, and its charge off the load.
func (cc *clientConn) dropLocked(at *attempt) {
	delete(cc.pending, at.id)
	cc.inflight.Add(-at.charge)
	at.charge = 0
}

// passReaderLocked hands the reader role to a waiter, if any.
func (cc *clientConn) passReaderLocked() {
	cc.reader = cc.waiters.popLatest()
	if cc.reader != nil {
		cc.reader.signal()
	}
	cc.closeIfIdleLocked()
}

// roundTrip sends one request on cc and waits for its answer, reading for
// everyone while it waits if nobody else is.
func (cc *clientConn) roundTrip(ctx context.Context, c *Client, call *callState, at *attempt, info *kernel.CallInfo, req any, reply any, own bool) error {
	at.begin()
	// A context that ended is not sent, as a stream is not opened: the
	// server would run the handler only to have it cancelled by the Cancel
	// that follows. A deadline given in place (which alone ends its
	// context) is checked below, with the timeout sent.
	if dc, ok := ctx.(*chainCtx); (!ok || dc.dl == nil) && ctx.Err() != nil {
		return c.ctxStatus(ctx, call, "before the request for "+info.Method+" was sent")
	}
	codec := c.codec
	payload, err := encodeInto(cc.conn, codec, req)
	if err != nil {
		logCodecPanic(cc.log.get(), info.Method, err)
		return kernel.Errorf(kernel.Internal, "encode request of %s with %s: %v", info.Method, codec.Name(), err)
	}
	info.RequestSize = len(payload)
	f := &at.req
	*f = kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: info.Method, Codec: codec.Name(), Metadata: info.Metadata, Payload: payload}
	if dl, ok := ctx.Deadline(); ok {
		if f.Timeout = call.sentTimeout(ctx, dl); f.Timeout <= 0 {
			cc.conn.Recycle(payload)
			return c.ctxStatus(ctx, call, "before the request for "+info.Method+" was sent")
		}
	}

	cc.mu.Lock()
	if cc.dead != nil || cc.draining {
		cc.mu.Unlock()
		cc.conn.Recycle(payload)
		return &kernel.Status{Code: kernel.Unavailable, Message: "connection to " + cc.conn.RemoteAddr() + " is closing; the call was not sent", Retryable: true}
	}
	cc.stopIdleReadLocked()
	cc.nextID++
	at.id = cc.nextID
	cc.pending[at.id] = at
	at.charge = int64(len(payload)) + cc.replyAvg
	cc.inflight.Add(at.charge)
	cc.mu.Unlock()
	if at.id == 2 {
		c.startIdleSweep() // see startIdleSweep for why not sooner
	}
	f.CallID = at.id

	if err := writeFrame(ctx, cc.conn, f); err != nil {
		cc.mu.Lock()
		cc.dropLocked(at)
		var st *kernel.Status
		if errors.As(err, &st) && cc.conn.Err() == nil {
			// The transport refused this frame alone and sent nothing of it
			// (its peer reads too slowly, say): the connection lives on.
			cc.unsent++
			cc.closeIfIdleLocked()
			cc.mu.Unlock()
			if ctx.Err() != nil { // it gave up waiting for room when ctx ended
				return c.ctxStatus(ctx, call, "while the request for "+info.Method+" waited for room to be sent to "+cc.conn.RemoteAddr())
			}
			return st
		}
		cc.mu.Unlock()
		cc.fail(err)
		return &kernel.Status{Code: kernel.Unavailable, Message: "send to " + cc.conn.RemoteAddr() + ": " + err.Error(), Retryable: true}
	}
	if err := cc.wait(ctx, c, call, at, info); err != nil {
		return err
	}
	return cc.finish(ctx, c, call, at, info, reply, own)
}

// wait blocks until at is answered, the connection dies or ctx is done,
// taking the reader role whenever it is free.
func (cc *clientConn) wait(ctx context.Context, c *Client, call *callState, at *attempt, info *kernel.CallInfo) error {
	var w sleeper
	for {
		cc.mu.Lock()
		if at.done {
			cc.leaveLocked(at)
			cc.mu.Unlock()
			return at.err
		}
		if cc.reader == nil || cc.reader == at {
			cc.waiters.remove(at)
			cc.reader = at
			cc.mu.Unlock()
			if cc.readFor(ctx, at) || ctx.Err() == nil {
				continue
			}
			cc.mu.Lock()
		} else {
			if !at.queued {
				cc.waiters.push(at)
			}
			cc.mu.Unlock()
			if w.sleep(ctx, at) {
				continue
			}
			cc.mu.Lock()
		}
		// ctx is done; cc.mu is held.
		cc.leaveLocked(at)
		if at.done {
			cc.mu.Unlock()
			return at.err
		}
		cc.dropLocked(at)
		cc.closeIfIdleLocked()
		cc.mu.Unlock()
		// Tell the server to stop working on it; its late answer, if any, is
		// dropped as a response for an unknown call.
		cc.cancel(at.id, ctx)
		return c.ctxStatus(ctx, call, "while waiting for the answer to "+info.Method+" from "+cc.conn.RemoteAddr())
	}
}

// readFor reads frames and hands them out until at's own answer arrives,
// ctx is done, or the connection fails, reporting whether the answer came.
// It gives the reader role up before returning.
func (cc *clientConn) readFor(ctx context.Context, at *attempt) (answered bool) {
	var last lastStream
	for {
		f, err := cc.conn.ReadFrame(ctx)
		if err != nil {
			if ctx.Err() != nil && cc.conn.Err() == nil {
				cc.mu.Lock()
				cc.passReaderLocked()
				cc.mu.Unlock()
				return false
			}
			cc.fail(err)
			return false
		}
		cc.headroom.noteFrame(len(f.Payload))
		switch f.Type {
		case kernel.FrameResponse:
			cc.mu.Lock()
			t := cc.pending[f.CallID]
			if t == nil {
				if cs := cc.streams[f.CallID]; cs != nil {
					cc.mu.Unlock()
					cs.final(cc, f)
					yieldToWoken(cc.conn)
					continue
				}
				cc.mu.Unlock()
				cc.log.get().Debug("dropping a response for a call nobody waits for (cancelled or timed out)", "call_id", f.CallID, "peer", cc.conn.RemoteAddr())
				f.Release()
				continue
			}
			cc.dropLocked(t)
			cc.replyAvg += (int64(len(f.Payload)) - cc.replyAvg) / 8
			t.resp, t.done = f, true
			// A finished call must not be offered the reader role: it is
			// about to leave and would take the role with it.
			cc.waiters.remove(t)
			if t == at {
				cc.passReaderLocked()
				cc.mu.Unlock()
				return true
			}
			// Signalled under the lock: once it is released, t may see its
			// answer, return, and be reused by another call.
			t.signal()
			cc.mu.Unlock()
			// The caller just signalled is queued on this goroutine's P. A
			// transport that polls for the next frame (shm-ring) keeps the
			// P meanwhile, and on a machine whose cores are all busy no
			// other P picks that caller up for tens of microseconds: let it
			// run first. Over tcp-lv, running it first also puts its next
			// request in the batch the connection holds while answers wait
			// unread. Measured: 4 callers over shm-ring 1.3-1.6x the
			// calls/s; tcp-lv 64 callers 158-180k against 117-119k calls/s
			// without the yield, 4 callers 28-30k against 23-27k.
			runtime.Gosched()
		case kernel.FrameStreamData:
			if err := cc.streamData(f, &last); err != nil {
				cc.log.get().Warn("closing a connection whose server broke the stream protocol", "peer", cc.conn.RemoteAddr(), "err", err)
				cc.fail(err)
				return false
			}
			yieldToWoken(cc.conn)
		case kernel.FrameWindowUpdate:
			cc.windowUpdate(f)
			yieldToWoken(cc.conn)
		case kernel.FrameGoAway:
			cc.serverGoingAway(f)
			cc.log.get().Debug("server is going away; new calls go elsewhere", "peer", cc.conn.RemoteAddr())
			f.Release()
		default:
			cc.log.get().Debug("ignoring unexpected frame", "type", f.Type, "call_id", f.CallID)
			f.Release()
		}
	}
}

// serverGoingAway stops new calls on cc, learning from goAway, the server's
// GoAway (nil when an answer said the server drains), the last call the
// server will serve. A server shutting down is passed over for a while; a
// GoAway that gives a reason (idle_timeout, tcp-lv's first_frame_timeout
// or too_many_pings) ends this connection only, and so does any on a
// spare connection, which speaks for no instance (it holds off spreading
// for a while, as a spreading dial that fails does).
//
// A GoAway that names no last call (kernel.GoAwayUnknownLast: a shutdown's
// or an idle connection's first) promises to serve whatever was sent
// before it was read, and asks how much that is; the answer is a GoAway
// counting the requests sent here, numbered less unsent (server_drain.go).
// A request numbered before the answer and refused whole after it leaves
// the count one high, and the server waits for its second GoAway. A
// second GoAway can only lower the last call served.
func (cc *clientConn) serverGoingAway(goAway *kernel.Frame) {
	cc.mu.Lock()
	cc.draining = true
	if goAway != nil {
		last := goAway.CallID
		if cc.goAway {
			last = min(last, cc.goAwayLast)
		}
		cc.goAway, cc.goAwayLast = true, last
		if goAway.Message != "" {
			cc.goAwayWhy = goAway.Message
		}
	}
	sent := cc.nextID - cc.unsent
	cc.mu.Unlock()
	shutdown := goAway == nil || goAway.Message == ""
	if goAway != nil && goAway.CallID == kernel.GoAwayUnknownLast && (shutdown || goAway.Message == idleTimeoutReason) {
		// The engine's first GoAway (a transport's, too_many_pings, closes
		// the connection as it sends it, and waits for no answer). A
		// request numbered before draining was set may still be on its
		// way: the server counts requests, so it waits for that one too.
		_ = cc.queueCtl(&kernel.Frame{Type: kernel.FrameGoAway, CallID: sent})
	}
	switch {
	case cc.pool == nil:
	case cc.spare:
		// As for a spreading dial that failed: the server would not keep
		// this spare (max_connections refuses it as soon as it is
		// dialled), and a spare dialled again for every loaded call
		// would be refused in turn.
		cc.pool.noSpread.start(dialAvoidance)
	case shutdown:
		cc.pool.markDown(goAwayAvoidance)
	}
	// With nothing pending and nobody but the idle reader reading, the
	// connection closes now: nothing more will be sent on it. (A caller
	// reading closes it once the last answer is in.)
	cc.mu.Lock()
	cc.closeIfIdleLocked()
	cc.mu.Unlock()
}

// finish turns the answer frame into the call's result.
func (cc *clientConn) finish(ctx context.Context, c *Client, call *callState, at *attempt, info *kernel.CallInfo, reply any, own bool) error {
	f := at.resp
	at.resp = nil
	info.ResponseMetadata = f.Metadata
	if f.Code != kernel.OK {
		err := &kernel.Status{Code: f.Code, Message: f.Message, Retryable: f.Flags&kernel.FlagRetryable != 0}
		f.Release()
		if err.Retryable && err.Code == kernel.Unavailable {
			// The server is draining; its GoAway may still be on the way.
			// (A retryable ResourceExhausted is a server shedding load: it
			// still serves this connection.)
			cc.serverGoingAway(nil)
		}
		if dl, ok := ctx.Deadline(); ok && err.Code == kernel.DeadlineExceeded && !time.Now().Before(dl) {
			// The server's copy of our deadline won the race with ours: say
			// which deadline it was, as if ours had fired first.
			return c.ctxStatus(ctx, call, "while "+cc.conn.RemoteAddr()+" ran "+info.Method+" (it stopped: "+err.Message+")")
		}
		return err
	}
	codec := c.codec
	if f.Codec != "" && f.Codec != codec.Name() {
		name := f.Codec
		f.Release()
		return kernel.Errorf(kernel.Internal, "server answered %s in codec %q, but the request was sent in %q", info.Method, name, codec.Name())
	}
	data := f.Payload
	info.ResponseSize = len(data)
	if codecAliases(codec) {
		// The value will point into these bytes after we return: give it a
		// copy the transport will never reuse.
		data = append([]byte(nil), data...)
	}
	err := call.decodeReply(codec, data, reply, own)
	f.Release()
	if err == errCallOver {
		return err
	}
	if err != nil {
		logCodecPanic(cc.log.get(), info.Method, err)
		return kernel.Errorf(kernel.Internal, "decode response of %s with %s: %v", info.Method, codec.Name(), err)
	}
	return nil
}
