package tcplv

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

var (
	_ kernel.Conn           = (*conn)(nil)
	_ kernel.HalfCloser     = (*conn)(nil)
	_ kernel.BufferedReader = (*conn)(nil)
)

const (
	// copyLimit: a payload below it is copied behind its header so that the
	// frame leaves in one write; a larger one is sent in place with writev,
	// where the copy would cost more than the extra iovec.
	copyLimit = 8 << 10
	// maxScratch and maxKeptArena bound the write buffers a connection
	// keeps between writes; a rare huge header or batch does not pin memory.
	maxScratch   = 64 << 10
	maxKeptArena = 1 << 20
	// maxQueuedPongs bounds the answers queued for a peer that floods Pings
	// without reading ours; one answer is all a liveness probe needs.
	maxQueuedPongs = 8
	// closeFlushTimeout bounds how long Close spends sending frames already
	// queued (a GoAway written just before Close, say).
	closeFlushTimeout = time.Second
)

// conn is one tcp-lv connection. It owns at most one goroutine, the
// writer, started the first time a frame waits for it, and stopped when
// the connection dies.
type conn struct {
	t      *transport
	nc     net.Conn // frames are read from and written to it (TLS or TCP)
	raw    net.Conn // the socket under nc: closing it never waits on a TLS alert
	local  string
	remote string

	// Read side, used by the one goroutine inside ReadFrame.
	br        *bufio.Reader
	in        kernel.Interner
	body      []byte       // the frame being read (its length); nil between frames
	next      *pooledFrame // the spare frame body came with, if it did
	got       int          // bytes of body read so far
	interrupt func()       // built once, so that ReadFrame's AfterFunc allocates no method value
	// readDeadline is the socket read deadline the reader last set for a
	// deadline-only context (zero: none). The socket's may be earlier (an
	// interrupt sets one in the past), never later.
	readDeadline time.Time
	// A ctx whose cancellation ReadFrame saw in two reads in a row is
	// watched on from then on (read.go's watch): lastDone is the Done
	// channel of the last ctx watched for one read alone, keptDone that
	// of the ctx watched on, keptStop ends that watch.
	lastDone, keptDone <-chan struct{}
	keptStop           func() bool

	want int // the length of the frame being read; body grows towards it

	// The frame clock (see read.go) cuts off a peer that starts a frame and
	// does not finish it, or, accepted, sends none at all.
	frameTimer    *time.Timer
	clockOn       bool         // the reader started the clock (reader only)
	clockFirst    atomic.Int32 // firstAwaited while the clock runs for the first frame
	clockDeadline atomic.Int64 // when it runs out, in Unix nanoseconds; 0 while it is stopped
	clockArmed    atomic.Bool  // frameTimer is running
	lastPing      time.Time    // when the peer's last Ping came (reader only)
	pingStrike    int          // Pings too close together, with nothing between; afterFrame after another frame (reader only)

	reading    atomic.Bool  // a ReadFrame is in progress (or, once dead, Close gave the read buffer back)
	unanswered atomic.Int64 // requests written minus responses read
	// idleWrite is when a request was last written with nobody reading,
	// since clockBase (see quiet); at first, when the connection was made.
	idleWrite atomic.Int64
	// lastRecv is when a socket read last brought data, as time since
	// clockBase: the keepalive's sign of life. It pings keepalive_interval
	// after it, not after the first of its runs that saw nothing new (up
	// to twice as late), and a Ping is answered once it moves.
	lastRecv atomic.Int64

	// Write side. wmu is held by whoever writes to the socket.
	wmu       sync.Mutex
	scratch   []byte      // a direct write: header and small payload
	iov       net.Buffers // writev segments; the backing array is reused
	iovw      net.Buffers // the copy WriteTo consumes; a field, so taking its address allocates nothing
	sock      rawSocket   // nc's socket read and written raw, where it can be (sock.ok)
	wq        frameQueue  // the batch being written
	writes    uint64      // write calls made, and frames written by them: the
	framesOut uint64      // coalescing ratio, read by tests
	// writeDeadline is the socket's write deadline, as time since
	// clockBase (0: not set yet); see setWriteDeadline.
	writeDeadline time.Duration
	// inflight is wq.bytes while wq is being written: queued bytes too,
	// for max_write_queue (appendLocked reads it under qmu alone).
	inflight atomic.Int64

	writeShut atomic.Pointer[error] // set by CloseWrite: WriteFrame refuses with it
	finSent   bool                  // the FIN is out: nothing may be written (wmu)

	qmu    sync.Mutex
	q      frameQueue    // frames waiting for the next write (qmu)
	queued atomic.Int32  // q.frames, readable without qmu
	wake   chan struct{} // capacity 1: the writer goroutine has frames to send
	// corked is set while a whole received frame waits for ReadFrame: the
	// requests and queued answers written meanwhile wait in q, and the
	// reader hands them to the writer goroutine, to leave in one write, as
	// soon as none is left (or it leaves on its context). Changed from
	// false to true by the reader alone, and to false only under qmu, so a
	// frame queued under cork is always seen by the uncorking reader.
	corked atomic.Bool
	// missedQueue is set by the writer goroutine when it found qmu held
	// and left the queue for the next wake-up (tryTakeQueue).
	missedQueue atomic.Bool

	pool bufferPool

	death      atomic.Pointer[error] // why the connection died; the first reason wins
	done       chan struct{}
	goroutines sync.WaitGroup // the writer

	// The writer goroutine starts on first need (startWriter): a
	// connection whose frames all leave inline never has one.
	writerOn atomic.Bool
	startMu  sync.Mutex // orders a start against Close's Wait

	// kaTimer runs keepalive, from the first request written on: it
	// probes only while requests wait for answers, so a connection that
	// sends none (a server's) never has one. kaMade orders making it
	// against stopping it and against its first run.
	kaTimer  atomic.Pointer[time.Timer]
	kaMade   sync.Mutex
	kaSeen   int64 // lastRecv when keepalive last looked (keepalive only)
	kaPinged bool  // keepalive's last run sent a Ping (keepalive only)
}

func newConn(t *transport, nc, raw net.Conn, accepted bool) *conn {
	c := &conn{
		t:      t,
		nc:     nc,
		raw:    raw,
		local:  nc.LocalAddr().String(),
		remote: nc.RemoteAddr().String(),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	c.idleWrite.Store(int64(time.Since(clockBase)))
	c.lastRecv.Store(c.idleWrite.Load())
	c.pool.init(t.buffers)
	c.sock.init(nc)
	c.br = getReader(socketReader{c}, t.readBufferSize)
	c.interrupt = func() { c.nc.SetReadDeadline(aLongTimeAgo) }
	// Made for later and set going only once the clock's state is in
	// place: made for first_frame_timeout, which may be 1ms, the timer
	// could fire first, find no deadline and disarm itself, and the clock
	// would then never run on this connection again (clockArmed stuck).
	c.frameTimer = time.AfterFunc(time.Hour, c.frameExpired)
	if accepted {
		c.clockOn = true
		c.clockArmed.Store(true)
		c.clockFirst.Store(firstAwaited)
		c.clockDeadline.Store(time.Now().Add(t.firstFrameTimeout).UnixNano())
		c.frameTimer.Reset(t.firstFrameTimeout)
	} else {
		c.frameTimer.Stop()
	}
	return c
}

// freeReaders keeps the read buffers of dead connections of the default
// size for new ones, as net/http keeps its bufio readers: a short
// connection (connect, one call, close) would otherwise allocate and clear
// a read buffer on each side (at 64 KiB, that was a tenth of its CPU). It
// holds free memory only; a reader taken from it is Reset before use.
var freeReaders sync.Pool // of *bufio.Reader with DefaultOptions' size

func getReader(r socketReader, size int) *bufio.Reader {
	if size == defaultReadBufferSize {
		if br, ok := freeReaders.Get().(*bufio.Reader); ok {
			br.Reset(r)
			return br
		}
	}
	return bufio.NewReaderSize(r, size)
}

// releaseReader gives a dead connection's read buffer back. It is called
// holding the reading flag, after the connection died, so no ReadFrame
// touches br at the same time, and every later one returns the death
// before touching it.
func (c *conn) releaseReader() {
	c.dropKeptWatch()
	if c.br == nil {
		return
	}
	if c.br.Size() == defaultReadBufferSize {
		c.br.Reset(nil)
		freeReaders.Put(c.br)
	}
	c.br = nil
}

// socketReader notes when a read last brought data, which is all
// keepalive needs: one monotonic clock read per read syscall with data.
type socketReader struct{ c *conn }

func (r socketReader) Read(p []byte) (int, error) {
	var n int
	var err error
	if r.c.sock.ok() {
		n, err = r.c.sock.read(p)
	} else {
		n, err = r.c.nc.Read(p)
	}
	if n > 0 {
		r.c.lastRecv.Store(int64(time.Since(clockBase)))
	}
	return n, err
}

// Buffer returns a pooled buffer for an outgoing payload.
func (c *conn) Buffer(sizeHint int) []byte { return c.pool.Get(sizeHint) }

// Recycle takes back a buffer from Buffer that will not be sent.
func (c *conn) Recycle(buf []byte) { c.pool.Put(buf) }

func (c *conn) LocalAddr() string     { return c.local }
func (c *conn) RemoteAddr() string    { return c.remote }
func (c *conn) Done() <-chan struct{} { return c.done }

func (c *conn) Err() error {
	if p := c.death.Load(); p != nil {
		return *p
	}
	return nil
}

// fail kills the connection with err unless it is already dead, and
// returns the reason it died.
func (c *conn) fail(level slog.Level, err error) error {
	if !c.death.CompareAndSwap(nil, &err) {
		return c.Err()
	}
	c.raw.Close() // before Done: a Close waiting on it returns with the socket shut
	close(c.done)
	c.frameTimer.Stop()
	c.stopKeepalive()
	c.t.log.Log(context.Background(), level, "tcp-lv: connection closed", "local", c.local, "remote", c.remote, "err", err)
	return err
}

// Close sends what is already queued, closes the socket and waits for the
// connection's goroutines. It is idempotent.
func (c *conn) Close() error {
	if !c.flushAndClose(&closedError{c.remote}) {
		// Another path is ending the connection (a failure, or a GoAway
		// the frame clock or the Ping limit sends), perhaps still flushing
		// behind a write in flight: wait for it, so that Close returns with
		// the connection closed, as it does when it ends it itself. That
		// flush is bounded as Close's own is (cutWriteDeadline).
		<-c.done
	}
	// A start in progress finishes before Wait; later ones see the death.
	c.startMu.Lock()
	//lint:ignore SA2001 empty on purpose: a barrier
	c.startMu.Unlock()
	c.goroutines.Wait()
	// With no reader inside ReadFrame, none can come in any more (it would
	// find the flag taken): the read buffer can go back now.
	if c.reading.CompareAndSwap(false, true) {
		c.releaseReader()
	}
	return nil
}

// closedError is the death of a connection its owner closed. Every Close
// makes one, a short connection's too, so it formats only when asked.
type closedError struct{ remote string }

func (e *closedError) Error() string {
	return "tcp-lv: connection " + e.remote + ": " + kernel.ErrClosed.Error()
}
func (e *closedError) Unwrap() error { return kernel.ErrClosed }

// flushAndClose kills the connection with err after sending what is
// queued, and reports whether it was this call that killed it.
func (c *conn) flushAndClose(err error) bool {
	if !c.death.CompareAndSwap(nil, &err) {
		return false
	}
	// Cut any write in flight short, then flush. With none in flight,
	// the deadline is cut only by a write the flush makes (each write
	// cuts it once death is set): a short connection's Close mostly has
	// nothing to send, and setting a deadline costs a timer change that
	// may wake the netpoller.
	if !c.wmu.TryLock() {
		c.cutWriteDeadline(time.Since(clockBase))
		c.wmu.Lock()
	}
	c.flushLocked()
	c.wmu.Unlock()
	c.raw.Close() // before Done: a Close waiting on it returns with the socket shut
	close(c.done)
	c.frameTimer.Stop()
	c.stopKeepalive()
	return true
}

// goAwayAndFail ends a connection whose peer broke a rule, telling it why
// first, and naming the last call served: kernel.GoAwayUnknownLast when
// the transport cannot know (the peer then resends none of its calls), 0
// when it served none. It logs the close at level.
func (c *conn) goAwayAndFail(level slog.Level, last uint64, reason string, err error) error {
	_ = c.enqueue(&kernel.Frame{Type: kernel.FrameGoAway, CallID: last, Message: reason}, nil)
	if c.flushAndClose(err) {
		c.t.log.Log(context.Background(), level, "tcp-lv: connection closed", "local", c.local, "remote", c.remote, "err", err)
	}
	return c.Err()
}
