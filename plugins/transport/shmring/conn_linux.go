package shmring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kernrpc/kernrpc/kernel"
)

var (
	_ kernel.Conn           = (*conn)(nil)
	_ kernel.HalfCloser     = (*conn)(nil)
	_ kernel.ContextWriter  = (*conn)(nil)
	_ kernel.BufferedReader = (*conn)(nil)
	_ kernel.FrameOwner     = (*ringFrame)(nil)
)

// conn is one attached client, seen from either side: it writes one ring
// of the segment and reads the other. Its one goroutine watches the socket,
// which carries only wake-ups after the handshake: when it ends, the peer
// is gone.
type conn struct {
	t      *transport
	sock   *net.UnixConn
	seg    *segment
	local  string
	remote string

	out producer
	in  consumer

	// refs counts the users of the mapping: the connection itself until it
	// dies, each ReadFrame and WriteFrame in progress, each frame and
	// buffer lent out. The last one unmaps the segment, so that no lent
	// payload ever points into unmapped memory.
	refs atomic.Int64

	readMu   sync.Mutex // held by ReadFrame: one reader at a time
	readWait waitStats
	readBell bell // wakes the sleeping reader
	space    gate // wakes the writers waiting for room
	wake     peerWaker

	streamMu sync.Mutex // one chunked frame at a time
	header   []byte     // streamMu: a chunked frame's header

	pool bufferPool // buffers for frames that do not go through the ring in place

	peerGone  atomic.Bool
	closing   atomic.Bool // Close began: the socket's end is our doing
	writeShut atomic.Pointer[error]
	death     atomic.Pointer[error]
	done      chan struct{}
	watching  sync.WaitGroup
}

// newConn starts a connection over an attached segment; server says which
// ring is whose.
func newConn(t *transport, sock *net.UnixConn, seg *segment, server bool, local, remote string) *conn {
	outDir, inDir := clientToServer, serverToClient
	if server {
		outDir, inDir = serverToClient, clientToServer
	}
	c := &conn{t: t, sock: sock, seg: seg, local: local, remote: remote, done: make(chan struct{}),
		readBell: make(bell, 1), wake: newPeerWaker(sock)}
	c.out = newProducer(seg.ring(outDir))
	c.in = newConsumer(seg.ring(inDir), t.maxFrame)
	c.in.limits = t.limits
	c.in.wake = &c.wake
	c.pool = newBufferPool(seg.mem)
	c.refs.Store(1)
	c.watching.Add(1)
	go c.watch()
	return c
}

func (c *conn) acquire() bool {
	for {
		n := c.refs.Load()
		if n <= 0 {
			return false
		}
		if c.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (c *conn) releaseRef() {
	if c.refs.Add(-1) == 0 {
		c.seg.unmap()
	}
}

func (c *conn) LocalAddr() string     { return c.local }
func (c *conn) RemoteAddr() string    { return c.remote }
func (c *conn) Done() <-chan struct{} { return c.done }

func (c *conn) Err() error {
	if p := c.death.Load(); p != nil {
		return *p
	}
	return nil
}

// die kills the connection with err unless it is already dead, and returns
// the reason it died. Sleepers on this side wake up and find it dead.
func (c *conn) die(level slog.Level, err error) error {
	if !c.death.CompareAndSwap(nil, &err) {
		return c.Err()
	}
	close(c.done)
	c.readBell.ring()
	c.space.open()
	c.sock.Close()
	c.t.log.Log(context.Background(), level, "shm-ring: connection closed", "local", c.local, "remote", c.remote, "err", err)
	c.releaseRef()
	return err
}

func (c *conn) peerLeft(how string) error {
	return c.die(slog.LevelDebug, fmt.Errorf("shm-ring: connection %s: %w: %s", c.remote, kernel.ErrPeerGone, how))
}

// protocolError closes the connection on something its peer wrote that
// no kernrpc peer writes; the reason is logged.
func (c *conn) protocolError(err error) error {
	return c.die(slog.LevelWarn, fmt.Errorf("shm-ring: connection %s: %w: %w", c.remote, kernel.ErrClosed, err))
}

// Close tells the peer that nothing more will come (after the frames
// already written), closes the socket and lets go of the segment, which
// is unmapped once every lent frame and buffer is back. It is idempotent.
func (c *conn) Close() error {
	// The peer may read the end record and close before this side dies:
	// its socket closing must not make this connection die of ErrPeerGone
	// instead of ErrClosed.
	c.closing.Store(true)
	if c.Err() == nil && c.acquire() {
		c.sendEnd(time.Time{})
		c.releaseRef()
	}
	c.die(slog.LevelDebug, fmt.Errorf("shm-ring: connection %s: %w", c.remote, kernel.ErrClosed))
	c.watching.Wait()
	return nil
}

// abandon closes a connection nothing was written on without the end
// record Close writes: the peer then finds its ring empty as the socket
// closes, and lets go of the connection and its segment there and then.
func (c *conn) abandon() {
	c.closing.Store(true)
	c.die(slog.LevelDebug, fmt.Errorf("shm-ring: connection %s: %w", c.remote, kernel.ErrClosed))
	c.watching.Wait()
}

// CloseWrite writes an end record after every frame already written: the
// peer reads them, then learns that nothing follows, while its frames can
// still be read here. Later writes fail with an error wrapping ErrClosed.
func (c *conn) CloseWrite() error {
	shut := fmt.Errorf("shm-ring: connection %s: write side %w", c.remote, kernel.ErrClosed)
	c.writeShut.CompareAndSwap(nil, &shut)
	if err := c.Err(); err != nil {
		return err
	}
	if !c.acquire() {
		return c.Err()
	}
	defer c.releaseRef()
	return c.sendEnd(time.Now().Add(c.t.waitTimeout))
}

// sendEnd publishes the end record, waiting for room until deadline (zero:
// not at all; a peer that does not read learns from the socket instead).
func (c *conn) sendEnd(deadline time.Time) error {
	p := &c.out
	for {
		p.mu.Lock()
		if p.endSent {
			p.mu.Unlock()
			return nil
		}
		pos, _, ok, err := p.reserve(wordLen, wordLen, slotWriting)
		seen := p.sawSpace()
		if ok {
			p.endSent = true
			p.written(pos, wordLen, kindEnd)
			p.publish()
		}
		p.mu.Unlock()
		switch {
		case err != nil:
			return c.protocolError(err)
		case ok:
			c.wake.ifSleeping(p.r.reader, wakeReader)
			return nil
		case !time.Now().Before(deadline):
			return c.ringFull(wordLen)
		}
		c.waitSpace(deadline, seen, true)
	}
}

// watch waits on the socket, which carries only wake-ups after the
// handshake; it passes them on to this side's sleepers. Its end means the
// peer closed or its process died. Frames it published before are still
// delivered to a reader that is waiting; with nobody reading and nothing
// unread, the connection dies at once.
func (c *conn) watch() {
	defer c.watching.Done()
	// Two bytes, so that a longer message (truncated to them) is told
	// from a wake-up.
	var b [2]byte
	n, err := c.sock.Read(b[:])
	for err == nil && n == 1 && c.wakeUp(b[0]) {
		n, err = c.sock.Read(b[:])
	}
	if c.Err() != nil || c.closing.Load() {
		return // we closed it
	}
	if n > 0 {
		c.protocolError(fmt.Errorf("%w: the peer sent something other than a one-byte wake-up on the liveness socket (first byte %d)", kernel.ErrMalformedFrame, b[0]))
		return
	}
	c.peerGone.Store(true)
	if !c.acquire() {
		return
	}
	defer c.releaseRef()
	c.readBell.ring()
	c.space.open()
	c.leftIfDrained()
}

// leftIfDrained kills the connection whose peer is gone when nobody reads
// and nothing is left unread. A reader inside ReadFrame sees peerGone
// itself, or, if it was on its way out, calls this again as it leaves:
// otherwise a peer gone while a frame was being returned would leave the
// connection alive until its next use.
func (c *conn) leftIfDrained() {
	if c.readMu.TryLock() {
		if c.Err() == nil && c.in.r.head.Load() == c.in.rd {
			c.peerLeft("it closed the connection or its process exited")
		}
		c.readMu.Unlock()
	}
}

// ringOffset reports where b starts in the ring this side writes, if it
// does.
func (c *conn) ringOffset(b []byte) (uint64, bool) {
	if cap(b) == 0 {
		return 0, false
	}
	o := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(c.out.r.data)))
	return uint64(o), o < uintptr(len(c.out.r.data))
}

// Buffer lends space in the ring itself when there is room for sizeHint
// bytes (or a default when the caller cannot tell), so that the codec
// encodes straight into the record WriteFrame publishes; otherwise, a
// pooled buffer.
func (c *conn) Buffer(sizeHint int) []byte {
	capacity := max(sizeHint, 0)
	if capacity == 0 {
		capacity = defaultLentCap
	}
	n := align8(lentPrefix + capacity)
	p := &c.out
	if n > p.maxRecord || c.Err() != nil || c.writeShut.Load() != nil || !c.acquire() {
		return c.pool.get(sizeHint)
	}
	p.mu.Lock()
	var pos uint64
	ok := false
	var err error
	if p.waiters == 0 && !p.endSent {
		pos, _, ok, err = p.reserve(n, n, slotLent)
	}
	p.mu.Unlock()
	if !ok {
		c.releaseRef()
		if err != nil {
			c.protocolError(err)
		}
		return c.pool.get(sizeHint)
	}
	off := int(pos%p.size) + lentPrefix
	return p.r.data[off : off : off+n-lentPrefix]
}

// Recycle takes back a buffer from Buffer that will not be sent.
func (c *conn) Recycle(buf []byte) {
	if off, ok := c.ringOffset(buf); ok {
		c.giveBack(off)
	} else {
		c.pool.put(buf)
	}
}

// giveBack ends the loan of the ring buffer at off: a lent slot becomes
// padding, an island is let go of. A buffer found in neither is not one
// this connection lent (or it was given back already).
func (c *conn) giveBack(off uint64) {
	p := &c.out
	p.mu.Lock()
	found := true
	freed := false
	if i := p.findLent(off); i >= 0 {
		// A recycled buffer at the end gives its space back without the
		// tail moving: writers waiting for room are told, as for an
		// island let go.
		if p.recycle(i) && p.waiters > 0 {
			p.freed.Add(1)
			freed = true
		}
	} else if p.letGo(off) {
		freed = p.waiters > 0
	} else {
		found = false
	}
	p.mu.Unlock()
	if freed {
		c.space.open()
	}
	if found {
		c.releaseRef()
	}
}

// writable says why nothing can be written, if so.
func (c *conn) writable() error {
	if err := c.Err(); err != nil {
		return err
	}
	if p := c.writeShut.Load(); p != nil {
		return *p
	}
	if c.peerGone.Load() {
		return c.peerLeft("it closed the connection or its process exited")
	}
	return nil
}

// WriteFrame publishes f. A payload encoded into a buffer Buffer lent gets
// its header written in front of it, in place: nothing is copied. Any
// other payload is copied into the ring once, in chunks if it does not
// fit in one record. When the ring stays full for wait_timeout (the peer
// does not read), WriteFrame fails with status ResourceExhausted; nothing
// of f is delivered, and the connection stays usable.
func (c *conn) WriteFrame(f *kernel.Frame) error { return c.WriteFrameContext(context.Background(), f) }

// WriteFrameContext is WriteFrame that also stops waiting for room when
// ctx is done (kernel.ContextWriter): f is refused alone, with ctx's code.
func (c *conn) WriteFrameContext(ctx context.Context, f *kernel.Frame) error {
	payload := f.Payload
	if err := c.writable(); err != nil {
		c.Recycle(payload)
		return err
	}
	hl := kernel.FrameHeaderLen(f)
	if n := hl - kernel.FramePrefixLen + len(payload); n > c.t.maxFrame {
		c.Recycle(payload)
		// Refused alone, with nothing of it sent: a *Status, so that the
		// kernel fails only this call and keeps the connection.
		return kernel.RefusedFrame(kernel.ResourceExhausted,
			fmt.Sprintf("shm-ring: %v frame of %d bytes exceeds max_frame_size %d", f.Type, n, c.t.maxFrame), kernel.ErrFrameTooLarge)
	}
	if len(f.Metadata) > 0 {
		if err := c.t.limits.Check(f); err != nil {
			c.Recycle(payload)
			return err
		}
	}
	if !c.acquire() {
		return c.Err()
	}
	defer c.releaseRef()
	off, inRing := c.ringOffset(payload)
	if !inRing {
		err := c.writeCopy(ctx, f, hl, payload)
		c.pool.put(payload)
		return err
	}
	p := &c.out
	p.mu.Lock()
	i := p.findLent(off)
	if i >= 0 && hl <= headroom && lentPrefix+len(payload) <= int(p.slots.at(i).size) {
		s := p.slots.at(i)
		s.state = slotWriting
		pos := s.pos
		p.mu.Unlock()
		rec := int(pos % p.size)
		start := lentPrefix - hl
		kernel.AppendFrameHeader(p.r.data[rec+start:rec+start:rec+lentPrefix], f)
		putContent(p.r.data, uint64(rec), start, hl+len(payload))
		c.commit(pos, align8(lentPrefix+len(payload)), kindFrame)
		c.releaseRef() // the loan's
		return nil
	}
	island := i < 0 && p.isIsland(off)
	p.mu.Unlock()
	if i < 0 && !island {
		return fmt.Errorf("shm-ring: connection %s: the payload points into the ring but not at a buffer Buffer lent (was it sent or recycled already?)", c.remote)
	}
	// The header does not fit in front of the payload, or the buffer was
	// given up on (an island). Its ring space is freed before this writer
	// waits for room to copy it to: writers that each hold lent space while
	// waiting for more can fill the ring between them and wait forever (64
	// callers on a 64 KiB ring did). So the payload moves to the heap
	// first, a second copy on this path only.
	moved := append(c.pool.get(len(payload)), payload...)
	c.giveBack(off)
	err := c.writeCopy(ctx, f, hl, moved)
	c.pool.put(moved)
	return err
}

// commit marks the record at pos written and publishes what can be.
func (c *conn) commit(pos uint64, used int, kind uint8) {
	p := &c.out
	p.mu.Lock()
	p.written(pos, used, kind)
	moved := p.publish()
	p.mu.Unlock()
	if moved {
		c.wake.ifSleeping(p.r.reader, wakeReader)
	}
}

// writeCopy copies f (header hl bytes long) into the ring: one record if
// it fits, else a chunked frame.
func (c *conn) writeCopy(ctx context.Context, f *kernel.Frame, hl int, payload []byte) error {
	total := hl + len(payload)
	n := align8(recordHeaderLen + total)
	p := &c.out
	if n > p.maxRecord {
		return c.writeChunked(ctx, f, payload)
	}
	pos, _, err := c.reserveWait(ctx, n, n)
	if err != nil {
		return err
	}
	rec := int(pos % p.size)
	putContent(p.r.data, uint64(rec), recordHeaderLen, total)
	b := rec + recordHeaderLen
	kernel.AppendFrameHeader(p.r.data[b:b:b+hl], f)
	copy(p.r.data[b+hl:b+total], payload)
	c.commit(pos, n, kindFrame)
	return nil
}

// writeChunked streams a frame too large for one record through the ring
// in pieces, each as large as the room there is (at least minChunk), so
// that the peer copies one piece out while the next is copied in.
func (c *conn) writeChunked(ctx context.Context, f *kernel.Frame, payload []byte) error {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	p := &c.out
	c.header = kernel.AppendFrameHeader(c.header[:0], f)
	hdr := c.header
	total := len(hdr) + len(payload)
	minChunk := p.maxRecord / 4
	kind := uint8(kindFirstChunk)
	for sent := 0; sent < total; {
		want := min(align8(recordHeaderLen+total-sent), p.maxRecord)
		pos, n, err := c.reserveWait(ctx, min(minChunk, want), want)
		if err != nil {
			if sent > 0 {
				p.mu.Lock()
				p.abortOwed = true
				p.mu.Unlock()
			}
			return err
		}
		piece := min(n-recordHeaderLen, total-sent)
		rec := int(pos % p.size)
		dst := p.r.data[rec+recordHeaderLen : rec+recordHeaderLen+piece]
		k := 0
		if sent < len(hdr) {
			k = copy(dst, hdr[sent:])
		}
		copy(dst[k:], payload[max(sent-len(hdr), 0):])
		putContent(p.r.data, uint64(rec), recordHeaderLen, piece)
		c.commit(pos, align8(recordHeaderLen+piece), kind)
		sent += piece
		kind = kindChunk
	}
	if cap(c.header) > maxKeptHeader {
		c.header = nil
	}
	return nil
}

// maxKeptHeader bounds the header buffer a connection keeps between
// chunked frames.
const maxKeptHeader = 64 << 10

// reserveWait reserves between minN and maxN bytes for a record this
// goroutine writes now, waiting up to wait_timeout, or until ctx is done
// if sooner, for the reader to make room.
func (c *conn) reserveWait(ctx context.Context, minN, maxN int) (pos uint64, n int, err error) {
	p := &c.out
	var deadline time.Time
	waiting, waited, ctxDeadline := false, false, false
	defer func() {
		if waiting {
			p.mu.Lock()
			p.waiters--
			p.mu.Unlock()
		}
	}()
	for {
		if err := c.writable(); err != nil {
			return 0, 0, err
		}
		p.mu.Lock()
		if p.endSent {
			p.mu.Unlock()
			return 0, 0, fmt.Errorf("shm-ring: connection %s: write side %w", c.remote, kernel.ErrClosed)
		}
		pos, n, ok, err := p.reserve(minN, maxN, slotWriting)
		seen := p.sawSpace()
		if !ok && err == nil && !waiting {
			p.waiters++
			waiting = true
		}
		p.mu.Unlock()
		switch {
		case err != nil:
			return 0, 0, c.protocolError(err)
		case ok:
			return pos, n, nil
		case ctx.Err() != nil:
			return 0, 0, c.ctxEnded(ctx, minN)
		case deadline.IsZero():
			deadline = time.Now().Add(c.t.waitTimeout)
			if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
				deadline, ctxDeadline = d, true
			}
		case !time.Now().Before(deadline):
			if ctxDeadline {
				return 0, 0, c.ctxEnded(ctx, minN)
			}
			return 0, 0, c.ringFull(minN)
		}
		// Only the first wait polls: later ones follow a wake-up or a
		// recheck, after which the writer has just looked.
		c.waitSpace(deadline, seen, !waited)
		waited = true
	}
}

// ctxEnded refuses a record for which the ring had no room before ctx
// ended; the ring's own clock may pass ctx's deadline before ctx says so.
func (c *conn) ctxEnded(ctx context.Context, n int) error {
	code := kernel.DeadlineExceeded
	if errors.Is(ctx.Err(), context.Canceled) {
		code = kernel.Canceled
	}
	return &kernel.Status{Code: code, Message: fmt.Sprintf(
		"shm-ring: connection %s: no room for a %d-byte record in the %d-byte ring before the write's context ended: the peer is not reading",
		c.remote, n, c.out.size)}
}

func (c *conn) ringFull(n int) error {
	return &kernel.Status{Code: kernel.ResourceExhausted, Message: fmt.Sprintf(
		"shm-ring: connection %s: no room for a %d-byte record in the %d-byte ring for %s: the peer is not reading; retry later, or raise ring_size or wait_timeout",
		c.remote, n, c.out.size, c.t.waitTimeout)}
}
