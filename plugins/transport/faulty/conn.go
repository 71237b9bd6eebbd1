package faulty

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// conn wraps a connection of the side the faults are on. Faults act on
// the frames it writes; what it reads passes through untouched (blackhole
// excepted), so the peer is the one that sees them.
type conn struct {
	inner kernel.Conn
	fs    *faults
	log   *slog.Logger

	errMu  sync.Mutex
	killed error // why this wrapper ended the connection, if it did

	closeOnce sync.Once
	closed    chan struct{}

	// Frames held back by a delay, in order, for the sender goroutine.
	// While any is held, every later frame joins them, so that frames keep
	// the order in which they were written, as on a byte stream.
	dmu        sync.Mutex
	held       []heldFrame
	lastDue    time.Time
	sending    bool // the sender is writing a frame it took from held
	senderOn   bool // the sender was started
	noSender   bool // Close ran: no sender starts any more
	senderDone chan struct{}
	closeWrite bool // CloseWrite waits for held to drain
	// writeShut: CloseWrite ran, so later writes fail. Set under dmu, so
	// that a frame is held either before it (sent ahead of the half-close)
	// or not at all.
	writeShut atomic.Bool
	wake      chan struct{}
}

type heldFrame struct {
	f   kernel.Frame
	due time.Time
}

func newConn(inner kernel.Conn, fs *faults, log *slog.Logger) *conn {
	return &conn{inner: inner, fs: fs, log: log, closed: make(chan struct{}), senderDone: make(chan struct{}), wake: make(chan struct{}, 1)}
}

func (c *conn) Buffer(sizeHint int) []byte { return c.inner.Buffer(sizeHint) }
func (c *conn) Recycle(buf []byte)         { c.inner.Recycle(buf) }
func (c *conn) Done() <-chan struct{}      { return c.inner.Done() }
func (c *conn) LocalAddr() string          { return c.inner.LocalAddr() }
func (c *conn) RemoteAddr() string         { return c.inner.RemoteAddr() }

// Err is the injected fault that ended the connection, if one did, so
// that logs say the test's faults killed it and not the network.
func (c *conn) Err() error {
	c.errMu.Lock()
	killed := c.killed
	c.errMu.Unlock()
	if err := c.inner.Err(); err != nil && killed != nil {
		return killed
	} else if err != nil {
		return err
	}
	return nil
}

// kill ends the connection as an injected fault: the peer sees it close.
func (c *conn) kill(reason string) error {
	c.errMu.Lock()
	if c.killed == nil {
		c.killed = fmt.Errorf("faulty: connection to %s: %s: %w", c.inner.RemoteAddr(), reason, kernel.ErrPeerGone)
		c.log.Debug("faulty: injected fault ends a connection", "peer", c.inner.RemoteAddr(), "fault", reason)
	}
	err := c.killed
	c.errMu.Unlock()
	_ = c.inner.Close()
	return err
}

func (c *conn) WriteFrame(f *kernel.Frame) error { return c.write(f, false) }

// queueFrame is QueueFrame, exposed only when the wrapped connection has
// one to honour it with.
func (c *conn) queueFrame(f *kernel.Frame) error { return c.write(f, true) }

// write applies the frame's fault and sends what is left of it. It never
// waits: a delayed or stalled frame is accepted at once, so that only a
// deadline, never a write, decides how long a call waits.
// A write on a connection already closed or half-closed fails as it
// would unwrapped, before any fault is drawn: a reset drawn there would
// report an injected fault for a frame never to be sent, and kill the
// read half that CloseWrite leaves open.
func (c *conn) write(f *kernel.Frame, queue bool) error {
	if err := c.Err(); err != nil {
		c.inner.Recycle(f.Payload)
		return err
	}
	if c.writeShut.Load() {
		c.inner.Recycle(f.Payload)
		return c.shutError()
	}
	a := c.fs.decide(f.Type)
	if a.reset {
		c.inner.Recycle(f.Payload)
		return c.kill(fmt.Sprintf("injected reset (before %v frame %d)", f.Type, c.fs.count()))
	}
	if a.swallow {
		c.inner.Recycle(f.Payload)
		return nil
	}
	frame := *f
	var dup kernel.Frame
	if a.dup {
		dup = frame
		dup.Payload = c.copyPayload(frame.Payload)
	}
	if a.truncate && len(frame.Payload) > 0 {
		frame.Payload = frame.Payload[:c.fs.intN(len(frame.Payload))]
	}
	if a.corrupt && !c.corrupt(&frame) {
		if a.dup {
			c.inner.Recycle(dup.Payload)
		}
		return nil
	}
	err := c.send(&frame, a.delay, queue)
	if a.dup {
		if err != nil {
			c.inner.Recycle(dup.Payload)
			return err
		}
		err = c.send(&dup, a.delay, queue)
	}
	return err
}

// copyPayload copies p into a buffer of the wrapped connection, as the
// engine's own encoding would: the duplicate must not share memory that
// the first write gives back to the transport.
func (c *conn) copyPayload(p []byte) []byte {
	buf := c.inner.Buffer(len(p))
	out := append(buf, p...)
	if cap(buf) > 0 && len(p) > 0 && &buf[:1][0] != &out[:1][0] {
		c.inner.Recycle(buf)
	}
	return out
}

// corrupt flips one byte of f, which the caller owns, and reports whether
// anything is left to send: a frame whose bytes no longer decode makes
// the receiver close the connection, so that is what happens.
func (c *conn) corrupt(f *kernel.Frame) bool {
	if c.fs.o.CorruptIn == CorruptPayload {
		if len(f.Payload) > 0 {
			f.Payload[c.fs.intN(len(f.Payload))] ^= c.fs.flip()
		}
		return true
	}
	wire := append(kernel.AppendFrameHeader(nil, f), f.Payload...)
	i := c.fs.intN(len(wire))
	wire[i] ^= c.fs.flip()
	var g kernel.Frame
	err := fmt.Errorf("its length prefix: the stream is out of step from here on")
	if i >= kernel.FramePrefixLen {
		err = kernel.DecodeFrame(wire[kernel.FramePrefixLen:], &g, nil)
	}
	c.inner.Recycle(f.Payload)
	if err != nil {
		c.kill(fmt.Sprintf("injected corruption of a %v frame at byte %d, which the receiver cannot decode (%v)", f.Type, i, err))
		return false
	}
	*f = g
	return true
}

// send writes f now, or hands it to the sender when it is delayed or
// frames before it still are.
func (c *conn) send(f *kernel.Frame, delay time.Duration, queue bool) error {
	c.dmu.Lock()
	if delay <= 0 && len(c.held) == 0 && !c.sending {
		c.dmu.Unlock()
		return c.writeInner(f, queue)
	}
	if c.noSender {
		// Close ran, after this writer found the connection alive: it has
		// given back the frames it held, and would never see this one.
		c.dmu.Unlock()
		c.inner.Recycle(f.Payload)
		return fmt.Errorf("faulty: connection to %s: %w", c.inner.RemoteAddr(), kernel.ErrClosed)
	}
	if c.writeShut.Load() {
		// CloseWrite ran after this writer looked: held, the frame would
		// follow the held ones out ahead of the half-close, or fail
		// unseen after it.
		c.dmu.Unlock()
		c.inner.Recycle(f.Payload)
		return c.shutError()
	}
	h := heldFrame{f: *f, due: time.Now().Add(delay)}
	h.f.Metadata = h.f.Metadata.Clone() // the caller may reuse its map once we return
	if h.due.Before(c.lastDue) {
		h.due = c.lastDue
	}
	c.lastDue = h.due
	c.held = append(c.held, h)
	if !c.senderOn && !c.noSender {
		c.senderOn = true
		go c.sender()
	}
	c.dmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

func (c *conn) writeInner(f *kernel.Frame, queue bool) error {
	if q, ok := c.inner.(kernel.FrameQueuer); ok && queue {
		return q.QueueFrame(f)
	}
	return c.inner.WriteFrame(f)
}

// sender writes held frames when they are due, until the connection ends.
// A frame the wrapped transport refuses here is lost, as a dropped one is:
// its writer was told it was sent, and its deadline ends its call.
func (c *conn) sender() {
	defer close(c.senderDone)
	for {
		c.dmu.Lock()
		c.sending = false
		if len(c.held) == 0 {
			closeWrite := c.closeWrite
			c.closeWrite = false
			c.dmu.Unlock()
			if closeWrite {
				c.closeInnerWrite()
			}
			select {
			case <-c.wake:
				continue
			case <-c.closed:
				return
			case <-c.inner.Done():
				return
			}
		}
		h := c.held[0]
		c.dmu.Unlock()
		if wait := time.Until(h.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.closed:
				t.Stop()
				return
			case <-c.inner.Done():
				t.Stop()
				return
			}
		}
		c.dmu.Lock()
		c.held = c.held[1:]
		c.sending = true
		c.dmu.Unlock()
		if err := c.inner.WriteFrame(&h.f); err != nil {
			c.log.Debug("faulty: a delayed frame was not sent", "type", h.f.Type, "call_id", h.f.CallID, "err", err)
		}
	}
}

// ReadFrame passes frames through; a blackhole takes them and never
// delivers one.
func (c *conn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	for {
		f, err := c.inner.ReadFrame(ctx)
		if err != nil {
			if ctx.Err() == nil {
				if killed := c.Err(); killed != nil {
					return nil, killed
				}
			}
			return nil, err
		}
		if !c.fs.o.Blackhole {
			return f, nil
		}
		f.Release()
	}
}

// Close closes the wrapped connection and gives back the memory of the
// frames still held.
func (c *conn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	err := c.inner.Close()
	c.dmu.Lock()
	started := c.senderOn
	c.noSender = true
	c.dmu.Unlock()
	if started {
		<-c.senderDone
	}
	c.dmu.Lock()
	held := c.held
	c.held = nil
	c.dmu.Unlock()
	for _, h := range held {
		c.inner.Recycle(h.f.Payload)
	}
	return err
}

// buffered is Buffered for a wrapped connection that has it.
func (c *conn) buffered() int {
	if c.fs.o.Blackhole {
		return 0 // nothing read will ever be delivered
	}
	return c.inner.(kernel.BufferedReader).Buffered()
}

// closeWriteHalf is CloseWrite for a wrapped connection that has it: held
// frames are sent first, as CloseWrite promises for queued ones.
func (c *conn) closeWriteHalf() error {
	c.dmu.Lock()
	c.writeShut.Store(true)
	if len(c.held) > 0 || c.sending {
		c.closeWrite = true
		c.dmu.Unlock()
		return nil
	}
	c.dmu.Unlock()
	return c.closeInnerWrite()
}

func (c *conn) closeInnerWrite() error { return c.inner.(kernel.HalfCloser).CloseWrite() }

// shutError is what a write after CloseWrite returns.
func (c *conn) shutError() error {
	return fmt.Errorf("faulty: connection to %s: write side %w", c.inner.RemoteAddr(), kernel.ErrClosed)
}
