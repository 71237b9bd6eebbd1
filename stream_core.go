package kernrpc

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

// streamCore is what both ends of a stream share: the messages received
// and not yet read, the credit each direction has, and how the stream
// ended. The side's own type (serverStream, ClientStream) adds the rest.
type streamCore struct {
	id    uint64
	conn  kernel.Conn
	flow  *connFlow
	codec kernel.Codec
	ctx   context.Context // the stream's: its end ends every wait
	// ctxStatus turns ctx's error into the status a wait returns.
	ctxStatus func() error
	// writeCtl sends control frames (WindowUpdate), never waiting on the
	// peer where the transport allows.
	writeCtl func(*kernel.Frame) error
	// side logs a codec's panic on a message with the stream's method.
	side interface{ logCodecPanic(err error) }

	sendWin sendWindow
	out     kernel.Frame // the StreamData frame being sent; one sender at a time
	sent    bool         // a frame that carried the headers went out: they go with the first only
	header  kernel.Metadata

	mu       sync.Mutex
	queue    []queuedMsg // received, not yet taken by the receiver
	slab     []byte      // small received payloads are copied in here; see copySmallLocked
	recvWin  recvWindow
	peerDone bool  // the peer sent its last message
	ended    error // set once the stream is over for this side: what later calls return
	final    error // client: how the server ended it, io.EOF for OK; later sends return it
	sendDone bool  // CloseSend was called (client) or the stream ended
	// opening is set while a client's attempt to open the stream is under
	// way, and lost to the status its connection failed with meanwhile:
	// the opener decides, since it may open the stream again elsewhere.
	opening bool
	lost    error
	// sendStopped is set (under mu) once ended, final or sendDone is, so
	// that a sender finds it may go on without taking mu, which the
	// connection's reader takes for every message it delivers.
	sendStopped atomic.Bool
	wake        chan struct{}

	// The receiver takes every queued message at once, so that a stream of
	// small messages costs the lock it shares with the connection's reader
	// once a batch rather than once a message, and counts what it read
	// against the windows in chunks of readChunk (see recv). rmu is the
	// receiver's own (and end's, to drop the batch), never held waiting.
	// The padding keeps its line apart from mu's, which the connection's
	// reader writes on another core for every message.
	_         [64]byte
	rmu       sync.Mutex
	batch     []queuedMsg // taken from queue, unread from bhead on
	bhead     int
	readCost  int64 // read from batch, not yet counted in recvWin and flow
	readChunk int64 // count readCost once it reaches this: window/readChunks
	_         [64]byte
}

// smallCopy is the size below which a received payload is copied into
// the stream's slab on arrival rather than held or copied into a pooled
// buffer.
const smallCopy = 256

// A stream's slabs start at minSlab bytes and double up to maxSlab, so
// that an idle stream keeps little and a busy one allocates once per
// hundreds of small messages rather than once per message.
const (
	minSlab = 1 << 10
	maxSlab = 16 << 10
)

// queuedMsg is one received message waiting for RecvMsg.
type queuedMsg struct {
	frame  *kernel.Frame // still lent by the transport; nil when data is a copy
	data   []byte
	pooled bool // data is a copy from the connection's pool
	cost   int64
}

func (s *streamCore) init(id uint64, conn kernel.Conn, flow *connFlow, codec kernel.Codec, window int64) {
	s.id, s.conn, s.flow, s.codec = id, conn, flow, codec
	s.recvWin.window, s.readChunk = window, window/readChunks
	s.wake = make(chan struct{}, 1)
}

func (s *streamCore) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliver queues a message frame the reader took off the connection,
// which has counted it against the connection's window. It never blocks:
// the sender's credit bounds the queue. It reports false if the peer sent
// without credit on the stream.
func (s *streamCore) deliver(f *kernel.Frame) bool {
	cost := kernel.StreamCost(len(f.Payload))
	s.mu.Lock()
	if s.ended != nil || s.peerDone {
		s.mu.Unlock()
		// Read by nobody: the connection's credit comes back at once.
		f.Release()
		s.flow.consumed(cost, s.writeCtl)
		return true
	}
	if !s.recvWin.accept(cost) {
		s.mu.Unlock()
		f.Release()
		return false
	}
	m := queuedMsg{data: f.Payload, cost: cost}
	switch aliases := codecAliases(s.codec); {
	case !aliases && len(f.Payload) < smallCopy:
		// Copied at once, however few are held: a copy this small costs
		// less than the two atomic adds on the count every connection's
		// streams share, and the frame goes straight back for the next
		// read.
		m.data = s.copySmallLocked(f.Payload)
		f.Release()
	case !aliases && atomic.AddInt32(&s.flow.held, 1) <= maxHeldPerConn:
		m.frame = f
	case !aliases:
		atomic.AddInt32(&s.flow.held, -1)
		m.data, m.pooled = append(s.flow.copies.Get(len(f.Payload)), f.Payload...), true
		f.Release()
	default:
		// Decoded values will point into the bytes: they must be theirs.
		m.data = append([]byte(nil), f.Payload...)
		f.Release()
	}
	s.queue = append(s.queue, m) // bounded by the window: accept checked it
	s.mu.Unlock()
	s.signal()
	return true
}

// copySmallLocked copies a small payload into the stream's slab. A window
// holds thousands of small messages, far more than a pool keeps, and a
// copy of its own each cost an allocation per message. The codec does not
// alias (deliver checked), so a slab is garbage once the messages in it
// are decoded. Messages are read in order, so the slabs still held carry
// the unread ones back to back: what the window allows, plus the read
// head of the oldest slab and the unfilled tail of the newest.
func (s *streamCore) copySmallLocked(p []byte) []byte {
	if cap(s.slab)-len(s.slab) < len(p) {
		s.slab = make([]byte, 0, min(max(2*cap(s.slab), minSlab), maxSlab))
	}
	start := len(s.slab)
	s.slab = append(s.slab, p...)
	return s.slab[start:len(s.slab):len(s.slab)]
}

// peerFinished records that the peer will send no more messages.
func (s *streamCore) peerFinished() {
	s.mu.Lock()
	s.peerDone = true
	s.mu.Unlock()
	s.signal()
}

// end marks the stream over for this side with err (what later SendMsg
// and RecvMsg calls return), dropping what was not read. It reports false
// if it had already ended.
func (s *streamCore) end(err error) bool {
	ended, _ := s.endFirst(err)
	return ended
}

// endFirst is end that also reports whether the peer had ended the
// stream first (a client's final status): only a side that ends a stream
// the peer still holds open tells the peer.
func (s *streamCore) endFirst(err error) (ended, first bool) {
	s.mu.Lock()
	if s.ended != nil {
		s.mu.Unlock()
		return false, false
	}
	first = s.final == nil
	s.ended, s.sendDone = err, true
	s.sendStopped.Store(true)
	q := s.queue
	s.queue, s.slab = nil, nil
	s.mu.Unlock()
	s.wakeSenders()
	s.rmu.Lock()
	cost := s.readCost + s.drop(s.batch[s.bhead:])
	s.batch, s.bhead, s.readCost = nil, 0, 0
	s.rmu.Unlock()
	cost += s.drop(q)
	if cost > 0 {
		s.flow.consumed(cost, s.writeCtl)
	}
	s.signal()
	return true, first
}

// wakeSenders wakes a sender waiting for credit, to see that the stream
// ended. It may wait on the connection's window rather than the stream's
// (waitCredit), which the end of one stream does not refill: another
// stream may hold that credit, or the connection be lost for good.
func (s *streamCore) wakeSenders() {
	s.sendWin.wakeAll()
	s.flow.send.wakeAll()
}

// drop releases messages nobody will read, returning the credit they
// held on the connection.
func (s *streamCore) drop(q []queuedMsg) (cost int64) {
	for i := range q {
		cost += q[i].cost
		s.releaseMsg(&q[i])
	}
	return cost
}

func (s *streamCore) releaseMsg(m *queuedMsg) {
	if m.frame != nil {
		m.frame.Release()
		m.frame = nil
		atomic.AddInt32(&s.flow.held, -1)
	}
	if m.pooled {
		s.flow.copies.Put(m.data)
		m.data, m.pooled = nil, false
	}
}

// codecFailed is the status for a message the codec could not encode or
// decode (doing); a codec's panic is logged with its stack first.
func (s *streamCore) codecFailed(doing string, err error) error {
	s.side.logCodecPanic(err)
	return kernel.Errorf(kernel.Internal, "%s stream message with %s: %v", doing, s.codec.Name(), err)
}

// recv decodes the next message into m, which fresh says the engine has
// just made (a typed Recv's). At the peer's end it returns atEnd's answer
// (io.EOF, or the final status on the client).
func (s *streamCore) recv(m any, fresh bool, atEnd func() error) error {
	for {
		s.rmu.Lock()
		if s.bhead < len(s.batch) {
			q := s.batch[s.bhead]
			s.batch[s.bhead] = queuedMsg{}
			s.bhead++
			s.readCost += q.cost
			// Counted by the chunk, and at the batch's last message: the
			// application may have read all it received, and read no more
			// of this stream for a while (it waits on another), while the
			// credit it holds is what that other stream's sender waits for.
			var counted int64
			if s.readCost >= s.readChunk || s.bhead == len(s.batch) {
				counted, s.readCost = s.readCost, 0
			}
			s.rmu.Unlock()
			err := unmarshal(s.codec, q.data, m, fresh)
			s.releaseMsg(&q)
			if counted > 0 {
				s.mu.Lock()
				grant := s.countReadLocked(counted)
				s.mu.Unlock()
				s.grant(grant, counted)
			}
			if err != nil {
				return s.codecFailed("decode", err)
			}
			return nil
		}
		// The batch is read: count it, and take what arrived since.
		counted := s.readCost
		s.readCost = 0
		s.mu.Lock()
		grant := s.countReadLocked(counted)
		took := len(s.queue) > 0
		if took {
			s.batch, s.queue, s.bhead = s.queue, s.batch[:0], 0
		}
		ended, peerDone := s.ended, s.peerDone
		s.mu.Unlock()
		s.rmu.Unlock()
		s.grant(grant, counted)
		switch {
		case took:
			continue
		case ended != nil:
			return ended
		case peerDone:
			return atEnd()
		}
		select {
		case <-s.wake:
		case <-s.ctx.Done():
			return s.ctxStatus()
		}
	}
}

// readChunks makes the receiver count what it read against the windows
// at least every window/readChunks bytes, well before the half window
// that earns the sender a grant, so that a long batch holds no credit back.
const readChunks = 8

// countReadLocked counts cost read against the stream's window,
// returning the credit to grant back on the stream (none once the peer is
// done sending).
func (s *streamCore) countReadLocked(cost int64) (grant int64) {
	if cost == 0 || s.peerDone {
		return 0
	}
	return s.recvWin.consumed(cost)
}

// finalErr is how the server ended the stream, for a client's RecvMsg at
// the end.
func (s *streamCore) finalErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final
}

// grant sends the credit a read earned back to the sender: on the stream,
// once half its window is read, and on the connection.
func (s *streamCore) grant(stream, cost int64) {
	s.flow.writeGrant(s.writeCtl, s.id, stream)
	if cost > 0 {
		s.flow.consumed(cost, s.writeCtl)
	}
}

// send encodes m and sends it as one StreamData frame once both windows
// allow it. A sender waiting for credit holds none of the transport's
// memory (a ring transport's space, which the connection's other calls
// need): with a codec that knows sizes, the credit is taken before the
// transport lends a buffer; without one, or for a message that encoded
// larger than its size, the encoding is set aside before the wait (see
// creditFor).
func (s *streamCore) send(m any) error {
	if err := s.sendErr(); err != nil {
		return err
	}
	size, err := sizeHint(s.codec, m)
	if err != nil {
		return s.codecFailed("encode", err)
	}
	cost := kernel.StreamCost(size)
	if size > 0 {
		if err := s.waitCredit(cost); err != nil {
			return err
		}
	}
	payload, err := encodeSized(s.conn, s.codec, m, size)
	if err != nil {
		if size > 0 {
			s.refund(cost)
		}
		return s.codecFailed("encode", err)
	}
	if actual := kernel.StreamCost(len(payload)); size == 0 {
		if payload, err = s.creditFor(payload, actual); err != nil {
			return err
		}
		cost = actual
	} else if actual < cost {
		// A size that was over: give the difference back, so that both
		// sides count what goes out.
		s.refund(cost - actual)
		cost = actual
	} else if actual > cost {
		// A size that was short: the credit taken for it may fit the
		// window where the message does not, and the receiver checks
		// what arrives. Taken again, whole, waiting if need be.
		s.refund(cost)
		if payload, err = s.creditFor(payload, actual); err != nil {
			return err
		}
		cost = actual
	}
	f := &s.out
	// Reset, not a composite literal: writing the whole frame cost its
	// every pointer word a write barrier while the collector marks, where
	// Reset zeroes only what is set (a sent frame holds just a payload).
	f.Reset()
	f.Type, f.CallID, f.Payload = kernel.FrameStreamData, s.id, payload
	if !s.sent {
		// The headers go with the first message that goes out: one the
		// transport refuses alone (over max_frame_size, or no room in a
		// ring for wait_timeout) leaves them for the next message, or the
		// final status (runStream).
		f.Metadata = s.header
	}
	if err := s.writeMessage(f); err != nil {
		s.refund(cost)
		if s.ctx.Err() != nil { // it gave up waiting for room when the stream's context ended
			return s.ctxStatus()
		}
		return s.writeFailed(err)
	}
	s.sent = true
	return nil
}

// writeMessage writes a message frame. A transport that queues frames
// (kernel.FrameQueuer: tcp-lv) gets it queued, never waiting on the peer,
// so that messages sent back to back share a write: written each on its
// own, a stream of 16 B messages over tcp-lv went 20 times slower. One
// whose writes may wait (kernel.ContextWriter: shm-ring) bounds the wait
// by the stream's context.
func (s *streamCore) writeMessage(f *kernel.Frame) error {
	if _, queues := s.conn.(kernel.FrameQueuer); !queues {
		if w, ok := s.conn.(kernel.ContextWriter); ok {
			return w.WriteFrameContext(s.ctx, f)
		}
	}
	return s.writeCtl(f)
}

// creditFor takes the credit for payload, encoded already into a buffer
// the transport lent, and returns the payload to send. When the credit is
// not there, it does not wait holding that buffer: on shm-ring it is space
// reserved in the ring, and senders blocked on receivers that stopped
// reading would keep it from the connection's other calls and streams
// (enough of them fill the ring, and every write in that direction fails
// with ResourceExhausted). The encoding waits in a pooled copy, and is
// copied into a buffer lent anew once the credit came. On error the
// payload is given back.
func (s *streamCore) creditFor(payload []byte, cost int64) ([]byte, error) {
	if s.tryCredit(cost) {
		return payload, nil
	}
	held := append(s.flow.copies.Get(len(payload)), payload...)
	s.conn.Recycle(payload)
	err := s.waitCredit(cost)
	payload = nil
	if err == nil {
		payload = append(s.conn.Buffer(len(held)), held...)
	}
	s.flow.copies.Put(held)
	return payload, err
}

// tryCredit takes cost from the stream's window and the connection's if
// both have it now, without waiting.
func (s *streamCore) tryCredit(cost int64) bool {
	if !s.sendWin.tryTake(cost) {
		return false
	}
	if s.flow.send.tryTake(cost) {
		return true
	}
	s.sendWin.refund(cost)
	return false
}

// refund gives back credit taken for bytes that did not go out (negative:
// takes more).
func (s *streamCore) refund(cost int64) {
	s.sendWin.refund(cost)
	s.flow.send.refund(cost)
}

// sendErr says why this side may not send any more, if it may not.
func (s *streamCore) sendErr() error {
	if !s.sendStopped.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return s.ended
	}
	if s.final != nil {
		return s.final
	}
	if s.sendDone {
		return kernel.Errorf(kernel.FailedPrecondition, "SendMsg after CloseSend on stream %d", s.id)
	}
	return nil
}

// waitCredit takes cost from the stream's window and the connection's,
// waiting while either is spent, until the stream ends or its context does.
func (s *streamCore) waitCredit(cost int64) error {
	for {
		ok, wait := s.sendWin.take(cost)
		if ok {
			if ok, wait = s.flow.send.take(cost); ok {
				return nil
			}
			s.sendWin.refund(cost)
		}
		// Looked at with wait in place: an end from now on closes it
		// (wakeSenders), and one before it closed none, so shows here.
		if err := s.sendErr(); err != nil {
			return err
		}
		select {
		case <-wait:
		case <-s.ctx.Done():
			// A client's stream context ends once the stream has (markOver):
			// its end, if it came first, is the answer.
			if err := s.sendErr(); err != nil {
				return err
			}
			return s.ctxStatus()
		}
	}
}

// writeFailed turns a failed write into the stream's error: a frame
// refused alone (too large) fails this message; anything else means the
// connection is gone.
func (s *streamCore) writeFailed(err error) error {
	var st *kernel.Status
	if errors.As(err, &st) && s.conn.Err() == nil {
		return st
	}
	return kernel.Errorf(kernel.Unavailable, "stream %d: connection to %s lost: %v", s.id, s.conn.RemoteAddr(), err)
}

// closeSend half-closes this side: the peer's RecvMsg returns io.EOF once
// it has read every message sent before.
func (s *streamCore) closeSend() error {
	s.mu.Lock()
	if s.ended != nil || s.sendDone {
		s.mu.Unlock()
		return nil
	}
	s.sendDone = true
	s.sendStopped.Store(true)
	if s.final != nil {
		// A client's stream the server has ended: there is no side left
		// to close, and a failed write here would hide the end it sent
		// (and messages before it) from the Recv that follows.
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	f := &kernel.Frame{Type: kernel.FrameStreamData, Flags: kernel.FlagEndStream, CallID: s.id}
	if !s.sent {
		f.Metadata = s.header
	}
	if err := s.conn.WriteFrame(f); err != nil {
		return s.writeFailed(err)
	}
	s.sent = true
	return nil
}

// writeFrame writes f, ending any wait on the peer when ctx ends where
// the transport can (kernel.ContextWriter: shm-ring waiting for room in
// its ring), so that a call's deadline bounds its writes too.
func writeFrame(ctx context.Context, conn kernel.Conn, f *kernel.Frame) error {
	if w, ok := conn.(kernel.ContextWriter); ok {
		return w.WriteFrameContext(ctx, f)
	}
	return conn.WriteFrame(f)
}

// queueFrame writes f through conn's writer where the transport has one
// (kernel.FrameQueuer), so that the caller never waits on the peer and
// frames sent back to back share a write; else with WriteFrame.
func queueFrame(conn kernel.Conn, f *kernel.Frame) error {
	if q, ok := conn.(kernel.FrameQueuer); ok {
		return q.QueueFrame(f)
	}
	return conn.WriteFrame(f)
}

// yieldToWoken lets the goroutine a reader just woke (a stream's
// receiver or sender) run before the reader waits for the next frame: it
// is queued on the reader's P, and a transport that polls or naps for the
// next frame (shm-ring) keeps that P meanwhile. Frames already buffered
// are read first; they may wake more.
func yieldToWoken(conn kernel.Conn) {
	if b, ok := conn.(kernel.BufferedReader); ok && b.Buffered() > 0 {
		return
	}
	runtime.Gosched()
}
