package tcplv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The write side: WriteFrame writes on the caller's goroutine when the
// socket is free, else queues the frame for the writer goroutine, which
// sends what queued up in one write or writev.

// frameQueue is a batch of encoded frames: headers and small payloads back
// to back in arena, large payloads referenced in place.
type frameQueue struct {
	arena  []byte
	large  []largePayload
	frames int
	pongs  int
	// bytes is the sum of the frames' length fields (their size less the
	// prefix, what max_frame_size bounds): with the batch being written
	// (conn.inflight), held to max_write_queue, so that two frames of the
	// largest size fit the smallest queue allowed, and no more than it
	// is held for a peer that does not read.
	bytes int
}

type largePayload struct {
	end     int    // the payload goes out after arena[:end]
	payload []byte // what is sent
	own     []byte // the buffer recycled once it is sent
}

// WriteFrame writes f now if the socket is free, else queues it for
// whoever writes next; either way it never waits for another write.
func (c *conn) WriteFrame(f *kernel.Frame) error { return c.writeFrame(context.Background(), f, false) }

// QueueFrame sends f with the writer goroutine's next batch and never on
// the caller's goroutine, so that frames produced back to back share a
// syscall.
func (c *conn) QueueFrame(f *kernel.Frame) error { return c.writeFrame(context.Background(), f, true) }

// ctxConn is a connection whose writes can stop waiting for room when a
// context ends (kernel.ContextWriter): one whose socket is written raw
// (rawSocket, plain TCP on Linux). A TLS write cannot stop midway and
// resume: tls.Conn fails every write after one that timed out.
type ctxConn struct{ *conn }

var _ kernel.ContextWriter = ctxConn{}

// WriteFrameContext is WriteFrame whose wait for room in the socket ends
// with ctx. Part of f may be out by then, so f is not refused: what is left
// of it, copied, goes on a goroutine of the connection, which holds the
// write side until it is out (later frames queue behind it), or until
// write_timeout fails the connection as it fails any write. The error is
// nil, as for a frame queued: the caller has given up on f's call, and
// the engine then ends it with ctx's code.
//
// ctx is watched only once the write finds no room: asking an engine's
// call context for its Done channel makes one.
func (c ctxConn) WriteFrameContext(ctx context.Context, f *kernel.Frame) error {
	return c.writeFrame(ctx, f, false)
}

// writeFrame writes f; the end of ctx ends a direct write's wait for room
// (ctxConn).
func (c *conn) writeFrame(ctx context.Context, f *kernel.Frame, queue bool) error {
	if err := c.Err(); err != nil {
		c.pool.Put(f.Payload)
		return err
	}
	if p := c.writeShut.Load(); p != nil {
		c.pool.Put(f.Payload)
		return *p
	}
	if n := kernel.FrameHeaderLen(f) - kernel.FramePrefixLen + len(f.Payload); n > c.t.maxFrame {
		c.pool.Put(f.Payload)
		// Refused alone, with nothing of it sent: a *Status, so that the
		// kernel fails only this call and keeps the connection.
		return kernel.RefusedFrame(kernel.ResourceExhausted,
			fmt.Sprintf("tcp-lv: %v frame of %d bytes exceeds max_frame_size %d", f.Type, n, c.t.maxFrame), kernel.ErrFrameTooLarge)
	}
	if len(f.Metadata) > 0 {
		if err := c.t.limits.Check(f); err != nil {
			c.pool.Put(f.Payload)
			return err
		}
	}
	if f.Type == kernel.FrameRequest {
		if c.quiet() && hungUp(c.raw) {
			c.pool.Put(f.Payload)
			return c.fail(slog.LevelDebug, fmt.Errorf("tcp-lv: connection %s: %w: it closed the connection while it was idle; the request was not sent", c.remote, kernel.ErrPeerGone))
		}
		c.unanswered.Add(1)
		if c.kaTimer.Load() == nil {
			c.startKeepalive()
		}
	}
	// While the reader still holds frames it received, the requests (and
	// queued answers) they prompt wait to leave together in one write.
	// Other frames (a Cancel, a GoAway) go at once.
	if (f.Type == kernel.FrameRequest || queue && f.Type == kernel.FrameResponse) && c.corked.Load() {
		if queued, err := c.enqueueCorked(f); queued || err != nil {
			return err
		}
	}
	if queue || !c.wmu.TryLock() {
		if err := c.enqueue(f, f.Payload); err != nil {
			return err
		}
		c.signalWriter()
		return nil
	}
	c.sock.ctx = ctx
	var err error
	switch {
	case c.finSent:
		c.pool.Put(f.Payload)
		err = *c.writeShut.Load()
	case c.queued.Load() == 0:
		err = c.writeDirect(f)
	default:
		// Frames queued before this one must leave first.
		err = c.flushWith(f)
	}
	c.sock.ctx = nil
	if c.sock.rest != nil {
		c.finishLater()
		return err
	}
	c.wmu.Unlock()
	return err
}

// finishLater sends what a write whose context ended left unsent
// (sock.rest) on a goroutine of the connection, which holds wmu (taken
// over from the caller) until it is out. The bytes count against
// max_write_queue meanwhile, as a batch being written does.
//
// The rest goes out under the deadline the write had (afterCtxCut put it
// back), not one of its own: it is that write, resumed, and a peer that
// drains nothing must still be cut off within 1.5 × write_timeout of the
// write that found no room, not that long after the context ended.
//
// A connection that died meanwhile with its socket closed (fail: done is
// closed, which flushAndClose does only once it holds wmu) cannot send
// the rest, and a Close may have stopped waiting for its goroutines: the
// rest is dropped there and then, with the connection's death as the
// write's end.
func (c *conn) finishLater() {
	rest := c.sock.rest
	c.sock.rest = nil
	c.startMu.Lock() // orders the start against Close's Wait
	defer c.startMu.Unlock()
	select {
	case <-c.done:
		c.wmu.Unlock()
		return
	default:
	}
	c.inflight.Store(int64(len(rest)))
	c.goroutines.Go(func() {
		defer c.wmu.Unlock()
		c.writes++
		if err := c.sock.writev(rest); err != nil {
			c.writeFailed(err)
		}
		c.inflight.Store(0)
	})
}

// quiet reports whether the peer may have closed the connection unseen:
// nobody reads, and the last request written so was quietAfter ago or
// more. A server that died while its client idled has left its FIN
// unread: a request written after it would be lost with the connection,
// though it never reached a server (the client could not tell), so
// writeFrame looks first. Requests still unanswered do not mean anyone
// will read: a call that gave up at its deadline leaves its answer, and
// the close behind it, to the next call. A caller calling back to back
// does not pay for the look: looking on every call made a lone caller's
// 16 B calls to a server process 15% slower (50-56 µs against 44).
func (c *conn) quiet() bool {
	if c.reading.Load() {
		return false
	}
	now := int64(time.Since(clockBase))
	return now-c.idleWrite.Swap(now) >= int64(quietAfter)
}

// quietAfter is how long a connection's reading may have stopped before a
// request written there looks for the peer's close first.
const quietAfter = 10 * time.Millisecond

// CloseWrite sends the frames already queued, then a FIN (after a TLS
// close_notify): the peer reads them and then EOF, while its frames can
// still be read here. Later writes fail with an error wrapping ErrClosed.
func (c *conn) CloseWrite() error {
	shut := fmt.Errorf("tcp-lv: connection %s: write side %w", c.remote, kernel.ErrClosed)
	c.writeShut.CompareAndSwap(nil, &shut)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.Err(); err != nil || c.finSent {
		return err
	}
	if err := c.flushLocked(); err != nil {
		return err
	}
	c.finSent = true
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.CloseWrite(); err != nil {
			return c.writeFailed(err)
		}
	}
	if hc, ok := c.raw.(interface{ CloseWrite() error }); ok {
		if err := hc.CloseWrite(); err != nil {
			return c.writeFailed(err)
		}
	}
	return nil
}

// writeDirect writes one frame from the caller's goroutine; wmu is held.
func (c *conn) writeDirect(f *kernel.Frame) error {
	b := kernel.AppendFrameHeader(c.scratch[:0], f)
	var err error
	if len(f.Payload) < copyLimit {
		b = append(b, f.Payload...)
		err = c.write(b)
	} else {
		c.iov = append(c.iov[:0], b, f.Payload)
		err = c.writev()
	}
	if cap(b) <= maxScratch {
		c.scratch = b[:0]
	}
	c.framesOut++
	c.pool.Put(f.Payload)
	return err
}

// enqueue appends f to the queue; own is the buffer recycled once f's
// payload has been copied or sent. A queue that would outgrow
// max_write_queue kills the connection: its peer is not reading.
func (c *conn) enqueue(f *kernel.Frame, own []byte) error {
	c.qmu.Lock()
	q := &c.q
	if f.Type == kernel.FramePong {
		if q.pongs >= maxQueuedPongs {
			c.qmu.Unlock()
			c.pool.Put(own)
			return nil
		}
		q.pongs++
	}
	own, queued := c.appendLocked(f, own)
	c.qmu.Unlock()
	c.pool.Put(own)
	if queued < 0 {
		return c.queueOverflow(-queued)
	}
	return nil
}

// appendLocked adds f to the queue; qmu is held. own is the buffer to
// recycle once f's payload is copied or sent; appendLocked returns it when
// the payload was copied (or f refused), for the caller to recycle after
// unlocking. queued is the queue's size in bytes after f, negated when f
// would have taken it past max_write_queue and was left out.
func (c *conn) appendLocked(f *kernel.Frame, own []byte) (_ []byte, queued int) {
	q := &c.q
	start := len(q.arena)
	q.arena = kernel.AppendFrameHeader(q.arena, f)
	n := len(q.arena) - start + len(f.Payload) - kernel.FramePrefixLen
	if held := q.bytes + int(c.inflight.Load()) + n; held > c.t.maxWriteQueue {
		q.arena = q.arena[:start]
		return own, -held
	}
	q.bytes += n
	if len(f.Payload) < copyLimit {
		q.arena = append(q.arena, f.Payload...)
	} else {
		q.large = append(q.large, largePayload{end: len(q.arena), payload: f.Payload, own: own})
		own = nil
	}
	q.frames++
	c.queued.Store(int32(q.frames))
	return own, q.bytes
}

// queueOverflow kills a connection whose peer lets more than
// max_write_queue pile up: only that peer suffers, and no memory grows
// without bound on its behalf.
func (c *conn) queueOverflow(bytes int) error {
	return c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: it is not reading; %d bytes queued for it would exceed max_write_queue %d",
		c.remote, kernel.ErrPeerGone, bytes, c.t.maxWriteQueue))
}

// enqueueCorked queues f without waking the writer if the connection is
// still corked, and reports whether it did.
func (c *conn) enqueueCorked(f *kernel.Frame) (bool, error) {
	c.qmu.Lock()
	if !c.corked.Load() {
		c.qmu.Unlock()
		return false, nil
	}
	own, queued := c.appendLocked(f, f.Payload)
	c.qmu.Unlock()
	if c.missedQueue.Load() && c.missedQueue.Swap(false) {
		c.signalWriter() // it came for frames queued before ours
	}
	c.pool.Put(own)
	if queued < 0 {
		return true, c.queueOverflow(-queued)
	}
	return true, nil
}

// uncork ends a cork before a read that may block: what was queued under
// it goes to the writer goroutine, so the read loop never writes itself.
func (c *conn) uncork() {
	if !c.corked.Load() {
		return
	}
	c.qmu.Lock()
	c.corked.Store(false)
	n := c.q.frames
	c.qmu.Unlock()
	if n > 0 {
		c.signalWriter()
	}
}

func (c *conn) signalWriter() {
	if !c.writerOn.Load() {
		c.startWriter()
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) startWriter() {
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if !c.writerOn.Load() && c.Err() == nil {
		c.goroutines.Go(c.writeLoop)
		c.writerOn.Store(true)
	}
}

// writeLoop sends queued frames whenever a caller queued some because the
// socket was busy.
func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.wmu.Lock()
		if c.tryTakeQueue() {
			c.writeTaken()
		}
		c.wmu.Unlock()
	}
}

// tryTakeQueue takes the queue for the writer goroutine (wmu held) unless
// qmu is held: its holder is then queueing a frame, and wakes the writer
// once it lets go (enqueueCorked, which does not otherwise, because
// missedQueue says so). Waiting for qmu instead meant spinning for it
// while a sender appended its frame: in a stream of 16 B messages, 14% of
// the time per message (BenchmarkServerStreamDefault).
func (c *conn) tryTakeQueue() bool {
	if !c.qmu.TryLock() {
		c.missedQueue.Store(true)
		// A holder that let go before seeing the flag is gone; one that
		// holds qmu now will see it.
		if !c.qmu.TryLock() {
			return false
		}
	}
	c.missedQueue.Store(false)
	c.takeQueueLocked()
	c.qmu.Unlock()
	return true
}

// takeQueueLocked swaps the queue with the writer's empty one; qmu and wmu
// are held.
func (c *conn) takeQueueLocked() {
	c.q, c.wq = c.wq, c.q
	c.queued.Store(0)
	c.inflight.Store(int64(c.wq.bytes))
}

// flushLocked takes the whole queue and sends it in one write or writev;
// wmu is held.
func (c *conn) flushLocked() error {
	c.qmu.Lock()
	c.takeQueueLocked()
	c.qmu.Unlock()
	return c.writeTaken()
}

// flushWith sends the queue with f last, in one write or writev; wmu is
// held. f is added and the queue taken in one hold of qmu, so that a frame
// queued meanwhile waits for the next write: a write that fails has then
// failed before f's last byte, and f did not reach the peer whole, as the
// error WriteFrame returns says (kernel.Conn). Behind f, such a frame
// could fail the write after f had left whole: the engine, taking f for
// unsent, would send its call again, and the server would run it twice.
func (c *conn) flushWith(f *kernel.Frame) error {
	c.qmu.Lock()
	own, queued := c.appendLocked(f, f.Payload)
	if queued >= 0 {
		c.takeQueueLocked()
	}
	c.qmu.Unlock()
	c.pool.Put(own)
	if queued < 0 {
		return c.queueOverflow(-queued)
	}
	return c.writeTaken()
}

// writeTaken sends the queue the writer took (c.wq); wmu is held.
func (c *conn) writeTaken() error {
	q := &c.wq
	if q.frames == 0 {
		return nil
	}
	var err error
	switch {
	case c.finSent:
		// Queued in a race with CloseWrite, or generated by the read path
		// (Pongs) after it: writing now would fail and kill the read side.
		err = *c.writeShut.Load()
	case len(q.large) == 0:
		err = c.write(q.arena)
	default:
		iov, start := c.iov[:0], 0
		for _, l := range q.large {
			if l.end > start {
				iov = append(iov, q.arena[start:l.end])
			}
			iov = append(iov, l.payload)
			start = l.end
		}
		if start < len(q.arena) {
			iov = append(iov, q.arena[start:])
		}
		c.iov = iov
		err = c.writev()
	}
	if !c.finSent {
		c.framesOut += uint64(q.frames)
	}
	for i := range q.large {
		c.pool.Put(q.large[i].own)
		q.large[i] = largePayload{}
	}
	q.large = q.large[:0]
	q.arena = q.arena[:0]
	if cap(q.arena) > maxKeptArena {
		q.arena = nil
	}
	q.frames, q.pongs, q.bytes = 0, 0, 0
	c.inflight.Store(0)
	return err
}

func (c *conn) write(b []byte) error {
	c.writes++
	c.setWriteDeadline()
	var err error
	if c.sock.ok() {
		err = c.sock.writev(b)
		if c.sock.fired {
			err = c.afterCtxCut(err)
		}
	} else {
		_, err = c.nc.Write(b)
	}
	if err != nil {
		return c.writeFailed(err)
	}
	return nil
}

// writev sends c.iov; wmu is held.
func (c *conn) writev() error {
	c.writes++
	c.setWriteDeadline()
	var err error
	if c.sock.ok() {
		err = c.sock.writev(c.iov...)
		if c.sock.fired {
			err = c.afterCtxCut(err)
		}
	} else {
		c.iovw = c.iov
		_, err = c.iovw.WriteTo(c.nc)
	}
	clear(c.iov) // the payloads go back to the pool: keep no reference
	c.iov = c.iov[:0]
	if err != nil {
		return c.writeFailed(err)
	}
	return nil
}

// setWriteDeadline makes sure the write about to start has at least
// write_timeout to finish. Moving the socket's deadline costs a runtime
// timer update, which can wake the netpoller: done before every write it
// was some 100 ns of a 16 B call's. So it is moved only once less than
// write_timeout is left, and then to 1.5 × write_timeout away: a write
// that the peer does not drain fails after between 1 and 1.5 ×
// write_timeout, and the deadline moves at most once per half of it.
func (c *conn) setWriteDeadline() {
	now := time.Since(clockBase) // one monotonic clock read, no wall clock
	if c.death.Load() != nil {
		c.cutWriteDeadline(now) // whatever ours was
		return
	}
	if c.writeDeadline-now >= c.t.writeTimeout {
		return
	}
	c.writeDeadline = now + c.t.writeTimeout + c.t.writeTimeout/2
	c.nc.SetWriteDeadline(clockBase.Add(c.writeDeadline))
	// Close may have cut it meanwhile; if ours replaced its, cut it again.
	if c.death.Load() != nil {
		c.cutWriteDeadline(now)
	}
}

// cutWriteDeadline gives the writes of a dying connection little time
// (now is time since clockBase): a GoAway written just before Close must
// still reach the peer, but a peer that does not drain its socket must not
// hold Close for write_timeout.
func (c *conn) cutWriteDeadline(now time.Duration) {
	c.nc.SetWriteDeadline(clockBase.Add(now + min(c.t.writeTimeout, closeFlushTimeout)))
}

// afterCtxCut puts back the write deadline a write's ended context cut
// (rawSocket.watchCtx). If the cut ended the write, with write_timeout not
// yet up, what it left (sock.rest) is for finishLater to send, and the
// write counts as done.
func (c *conn) afterCtxCut(err error) error {
	now := time.Since(clockBase)
	c.nc.SetWriteDeadline(clockBase.Add(c.writeDeadline))
	if c.death.Load() != nil {
		c.cutWriteDeadline(now) // Close may have cut it before ours
	}
	if c.sock.rest == nil {
		return err
	}
	if now >= c.writeDeadline {
		c.sock.rest = nil
		return err // write_timeout's own deadline passed too
	}
	return nil
}

// clockBase anchors the monotonic deadlines setWriteDeadline keeps.
var clockBase = time.Now()

func (c *conn) writeFailed(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: it did not drain its socket for %s", c.remote, kernel.ErrPeerGone, c.t.writeTimeout))
	}
	return c.fail(slog.LevelInfo, fmt.Errorf("tcp-lv: connection %s: %w: %w", c.remote, kernel.ErrPeerGone, err))
}
