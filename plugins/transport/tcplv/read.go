package tcplv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc/internal/bufpool"
	"github.com/kernrpc/kernrpc/kernel"
)

// The read side: one goroutine at a time inside ReadFrame decodes frames
// from the buffered socket, answers Pings and enforces the read limits.

// Buffered reports the received bytes ReadFrame can consume without
// waiting; only the reader may call it. The reader calls it between
// ReadFrames, so it takes the reading flag as ReadFrame does, and Close
// never gives the read buffer back under it.
func (c *conn) Buffered() int {
	if !c.reading.CompareAndSwap(false, true) {
		return 0 // Close holds the flag: dead, and the buffer given back
	}
	n := 0
	if c.br != nil {
		n = c.br.Buffered()
	}
	c.reading.Store(false)
	return n
}

// ReadFrame returns the next Request, Response, Cancel, GoAway or stream
// frame; it answers Pings and swallows Pongs on the way. When ctx ends
// first it returns ctx's error and keeps the partly read frame for the
// next call.
func (c *conn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	if !c.reading.CompareAndSwap(false, true) {
		// Close holds the flag once it has given the read buffer back.
		if err := c.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("tcp-lv: ReadFrame called while another ReadFrame is in progress")
	}
	// One deferred function, not two: with two, the function's returns
	// are too many for the compiler to open-code them, and each ReadFrame
	// paid the runtime's deferreturn (some 20 ns, a stream message's 5%).
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
		c.reading.Store(false)
	}()
	if err := c.Err(); err != nil {
		c.releaseReader()
		return nil, err
	}
	// A deadline-only context is not asked for Err, which reads the
	// clock: past its deadline, a frame already here is still returned,
	// and a read fails at once on the socket deadline below.
	deadline, deadlineOnly := kernel.DeadlineOnly(ctx)
	if !deadlineOnly {
		if err := ctx.Err(); err != nil {
			c.uncork() // the next reader may be a while
			return nil, err
		}
	}
	// A read deadline in the past wakes a blocked read, so no goroutine
	// waits on ctx for us. It is armed only before a read that may block:
	// a frame already in the buffer (most of them, with many callers) is
	// taken without the lock and allocations of context.AfterFunc.
	// A context that only its deadline ends (kernel.DeadlineOnly) needs no
	// watch at all: the socket's read deadline is its own. It is moved only
	// when it would come too late: moving it on every read costs a timer
	// update that can wake the netpoller, some µs a call, while one set
	// for an earlier call's deadline ends a read early at worst once per
	// timeout, and the read then goes on with this one.
	for {
		if !c.frameBuffered() {
			c.uncork()
			switch {
			case deadlineOnly:
				if c.readDeadline.IsZero() || c.readDeadline.After(deadline) {
					c.readDeadline = deadline
					c.nc.SetReadDeadline(deadline)
				}
			case stop == nil:
				stop = c.watch(ctx)
			}
		}
		pf, err := c.readFrame()
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) || c.Err() != nil {
				err = c.readFailed(err)
				c.releaseReader()
				return nil, err
			}
			// Interrupted by ctx, or by an earlier call's AfterFunc that
			// fired late. Clearing first, then checking ctx, cannot miss a
			// cancellation: one landing after the check sets the deadline
			// again.
			c.readDeadline = time.Time{}
			c.nc.SetReadDeadline(time.Time{})
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		if c.clockOn && !c.stopFrameClock() {
			// The first frame came as first_frame_timeout ran out, and the
			// clock has told the peer that no call was served: one served
			// now would be served twice once the peer sends it again.
			c.pool.putFrame(pf)
			<-c.done
			c.releaseReader()
			return nil, c.Err()
		}
		switch pf.f.Type {
		case kernel.FramePing:
			if err := c.answerPing(pf); err != nil {
				return nil, err
			}
			continue
		case kernel.FramePong:
			c.pool.putFrame(pf)
			continue
		case kernel.FrameResponse:
			c.answered()
		}
		c.pingStrike = afterFrame
		pf.f.SetOwner(pf)
		// Corked exactly while a whole frame waits here: a reader that
		// stops reading after this frame leaves nothing held.
		if c.frameBuffered() {
			c.corked.Store(true)
		} else {
			c.uncork()
		}
		return &pf.f, nil
	}
}

// watch makes a cancellation of ctx interrupt the read about to block
// (reader only), and returns what ends the watch when ReadFrame returns, or
// nil. context.AfterFunc costs two allocations, so a caller that reads
// with the same ctx again and again (one whose ctx outlives its calls) is
// watched once: a ctx whose Done channel the last watched read had too
// keeps its watch until another ctx is met twice in a row, or the
// connection dies. A ctx made for one call (the engine's per-call deadline, a hedge's
// attempt) is canceled as its call ends; watched on past its read, its
// cancellation would interrupt a later one, so it is watched for its
// read alone. A kept watch that fires late interrupts at most one read,
// which then goes on as after any late interrupt.
func (c *conn) watch(ctx context.Context) (stop func() bool) {
	done := ctx.Done()
	if done == nil || done == c.keptDone {
		return nil
	}
	if done != c.lastDone {
		c.lastDone = done
		return context.AfterFunc(ctx, c.interrupt)
	}
	c.dropKeptWatch()
	c.keptDone, c.keptStop = done, context.AfterFunc(ctx, c.interrupt)
	return nil
}

// dropKeptWatch ends the watch kept on a reused ctx, if any (reader only).
func (c *conn) dropKeptWatch() {
	if c.keptStop != nil {
		c.keptStop()
		c.keptDone, c.keptStop = nil, nil
	}
}

// frameBuffered reports whether readFrame can complete without reading
// from the socket. A length it cannot accept counts as buffered: readFrame
// fails on it at once.
func (c *conn) frameBuffered() bool {
	if c.body != nil {
		return c.br.Buffered() >= c.want-c.got
	}
	// Peek would read from the socket for bytes not yet buffered.
	if c.br.Buffered() < kernel.FramePrefixLen {
		return false
	}
	prefix, _ := c.br.Peek(kernel.FramePrefixLen)
	n, err := kernel.ReadFrameLength(prefix, c.t.maxFrame)
	return err != nil || c.br.Buffered() >= kernel.FramePrefixLen+n
}

// readFrame reads and decodes one frame, resuming a partly read one. The
// length prefix is peeked, not consumed, until it is whole.
func (c *conn) readFrame() (*pooledFrame, error) {
	if c.body == nil {
		if c.br.Buffered() < kernel.FramePrefixLen {
			// Wait for the frame's first bytes without a clock; from
			// then on, it must arrive whole within frame_timeout.
			if _, err := c.br.Peek(1); err != nil {
				return nil, err
			}
			if c.br.Buffered() < kernel.FramePrefixLen {
				c.frameBegun()
			}
		}
		prefix, err := c.br.Peek(kernel.FramePrefixLen)
		if err != nil {
			return nil, err
		}
		n, err := kernel.ReadFrameLength(prefix, c.t.maxFrame)
		if err != nil {
			return nil, c.protocolError(err)
		}
		c.br.Discard(kernel.FramePrefixLen)
		if n <= bufpool.MinSize && c.br.Buffered() >= n {
			if pf := c.pool.takeSpare(); pf != nil {
				// The whole frame is here: read it into the spare without
				// recording it in c, where each pointer stored costs a
				// write barrier while the collector marks (reslicing the
				// spare's own buffer stores none).
				pf.body = pf.body[:n]
				c.br.Read(pf.body) // whole: Buffered covers it
				return c.decode(pf)
			}
		}
		// Memory follows the bytes that arrive, not the length announced:
		// a peer announcing 4 MiB and sending nothing gets firstFrameBuffer.
		c.want, c.got = n, 0
		if n <= bufpool.MinSize {
			c.next = c.pool.takeSpare()
		}
		if c.next != nil {
			c.body = c.next.body[:n]
		} else {
			c.body = c.pool.Get(min(n, firstFrameBuffer))
			c.body = c.body[:min(n, cap(c.body))]
		}
	}
	if c.br.Buffered() < c.want-c.got {
		c.frameBegun()
	}
	for c.got < c.want {
		if c.got == len(c.body) {
			c.growBody()
		}
		n, err := c.br.Read(c.body[c.got:])
		c.got += n
		if err != nil && c.got < c.want {
			return nil, err
		}
	}
	pf := c.next
	if pf != nil {
		c.next = nil
	} else {
		pf = c.pool.getFrame(c)
	}
	pf.body, c.body = c.body, nil
	return c.decode(pf)
}

// decode decodes the frame whose bytes pf.body holds.
func (c *conn) decode(pf *pooledFrame) (*pooledFrame, error) {
	if err := c.t.limits.Decode(pf.body, &pf.f, &c.in); err != nil {
		c.pool.putFrame(pf)
		return nil, c.protocolError(err)
	}
	return pf, nil
}

// firstFrameBuffer is what a frame gets before its bytes arrive: above it,
// the buffer doubles as they come. It covers a 64 KiB message whole.
const firstFrameBuffer = 64<<10 + 512

// growBody doubles the buffer of the frame being read, up to its length.
func (c *conn) growBody() {
	size := min(c.want, 2*len(c.body))
	bigger := c.pool.Get(size)
	bigger = bigger[:min(c.want, cap(bigger))]
	copy(bigger, c.body[:c.got])
	c.pool.Put(c.body)
	c.body = bigger
}

// protocolError closes the connection on a frame it cannot accept; the
// peer is not gone, we hung up.
func (c *conn) protocolError(err error) error {
	return c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: %w", c.remote, kernel.ErrClosed, err))
}

func (c *conn) readFailed(err error) error {
	if dead := c.Err(); dead != nil {
		return dead
	}
	switch {
	case err == io.EOF && c.body == nil && c.br.Buffered() == 0:
		return c.fail(slog.LevelDebug, fmt.Errorf("tcp-lv: connection %s: %w: it closed the connection", c.remote, kernel.ErrPeerGone))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return c.fail(slog.LevelInfo, fmt.Errorf("tcp-lv: connection %s: %w: it closed the connection in the middle of a frame", c.remote, kernel.ErrPeerGone))
	}
	return c.fail(slog.LevelInfo, fmt.Errorf("tcp-lv: connection %s: %w: %w", c.remote, kernel.ErrPeerGone, err))
}

// answerPing queues a Pong carrying the Ping's payload. The read path never
// writes itself: a peer that does not read must not stall our reading. A
// Ping over kernel.MaxPingPayload, or Pings closer together than
// min_ping_interval with nothing else between, more than maxPingStrikes
// times, end the connection: answering them would make us the amplifier.
func (c *conn) answerPing(pf *pooledFrame) error {
	if n := len(pf.f.Payload); n > kernel.MaxPingPayload {
		c.pool.putFrame(pf)
		return c.protocolError(fmt.Errorf("%w: Ping payload of %d bytes exceeds %d", kernel.ErrMalformedFrame, n, kernel.MaxPingPayload))
	}
	now := time.Now()
	// A Ping after another frame is no strike, however close to the Ping
	// before that frame: only Pings with nothing between count.
	if c.pingStrike != afterFrame && !c.lastPing.IsZero() && now.Sub(c.lastPing) < c.t.minPingInterval {
		if c.pingStrike++; c.pingStrike > maxPingStrikes {
			c.pool.putFrame(pf)
			return c.goAwayAndFail(slog.LevelWarn, kernel.GoAwayUnknownLast, "too_many_pings", fmt.Errorf("tcp-lv: connection %s: %w: it sent Pings less than min_ping_interval %s apart %d times in a row",
				c.remote, kernel.ErrClosed, c.t.minPingInterval, c.pingStrike))
		}
	} else {
		c.pingStrike = 0 // far enough apart: the row is broken
	}
	c.lastPing = now
	body := pf.body
	pf.body = nil
	err := c.enqueue(&kernel.Frame{Type: kernel.FramePong, CallID: pf.f.CallID, Payload: pf.f.Payload}, body)
	c.pool.putFrame(pf)
	c.signalWriter()
	return err
}

// maxPingStrikes is how many Pings in a row may come too soon, as in
// grpc-go's keepalive enforcement: a burst of two is forgiven.
const maxPingStrikes = 2

// afterFrame is conn.pingStrike once a frame other than a Ping or Pong
// came: the next Ping starts a new row.
const afterFrame = -1

// frameBegun starts the frame clock when a read is about to wait for the
// rest of a frame (reader only).
func (c *conn) frameBegun() {
	if !c.clockOn {
		c.startFrameClock(c.t.frameTimeout)
	}
}

// startFrameClock gives the frame being read d to arrive whole (reader
// only). It stores a deadline; the timer is touched only when it is not
// already running, since resetting a timer on every frame can wake the
// runtime's netpoller each time: 64 KiB calls at one caller cost some
// 18 µs more CPU per side that way.
func (c *conn) startFrameClock(d time.Duration) {
	c.clockOn = true
	c.clockDeadline.Store(time.Now().Add(d).UnixNano())
	if c.clockArmed.CompareAndSwap(false, true) {
		c.frameTimer.Reset(d)
	}
}

// stopFrameClock ends the clock when a frame has arrived whole (reader
// only). The timer runs on; finding no deadline, it disarms itself, and
// a clock started before it fires finds it armed for an earlier time. It
// reports false for an accepted connection's first frame when the clock
// ran out first: that frame must be dropped (see frameExpired).
func (c *conn) stopFrameClock() bool {
	c.clockOn = false
	// Cleared before the first frame is claimed: a timer that loses the
	// claim looks again and must find no deadline.
	c.clockDeadline.Store(0)
	if c.clockFirst.Load() != firstClaimed {
		if !c.clockFirst.CompareAndSwap(firstAwaited, firstClaimed) {
			return false
		}
		// The timer was set for first_frame_timeout, which may be later
		// than the next frame's deadline: stop it, so the next clock sets
		// it afresh. (A callback already under way disarms it itself.)
		if c.frameTimer.Stop() {
			c.clockArmed.Store(false)
		}
	}
	return true
}

// The states of an accepted connection's first frame (conn.clockFirst),
// which the reader and the frame clock's timer each claim: whichever does
// first decides whether the connection serves at all.
const (
	firstClaimed int32 = iota // it arrived (or the connection was dialled)
	firstAwaited
	firstLate // first_frame_timeout ran out: the peer was told none is served
)

// frameExpired runs on the frame clock's timer: it sleeps again until the
// deadline when one is set and not yet passed, disarms when none is set,
// and cuts the connection off when the deadline passed.
func (c *conn) frameExpired() {
	for c.Err() == nil {
		dl := c.clockDeadline.Load()
		now := time.Now().UnixNano()
		switch {
		case dl == 0:
			c.clockArmed.Store(false)
			// A clock started meanwhile found the timer armed: arm it.
			if c.clockDeadline.Load() != 0 && c.clockArmed.CompareAndSwap(false, true) {
				continue
			}
			return
		case now < dl:
			c.frameTimer.Reset(time.Duration(dl - now))
			return
		case c.clockFirst.Load() == firstAwaited:
			// A peer that is silent may be a client's spare connection,
			// with a call on its way: the GoAway, naming no call served,
			// lets the client send that call again. A frame arriving now
			// is dropped by the reader, which lost the claim. Logged at
			// INFO: a kernrpc client leaves a spare silent whenever the
			// load that dialled it passes.
			if c.clockFirst.CompareAndSwap(firstAwaited, firstLate) {
				c.goAwayAndFail(slog.LevelInfo, 0, "first_frame_timeout", fmt.Errorf("tcp-lv: connection %s: %w: it sent no frame within first_frame_timeout %s; told it to send its calls again elsewhere", c.remote, kernel.ErrClosed, c.t.firstFrameTimeout))
				return
			}
			// The reader claimed the frame meanwhile: look again.
		case !c.reading.Load():
			// Nobody reads: the rest may be sitting unread in the socket.
			// The swap loses to a reader that stopped the clock meanwhile.
			if c.clockDeadline.CompareAndSwap(dl, now+int64(c.t.frameTimeout)) {
				c.frameTimer.Reset(c.t.frameTimeout)
				return
			}
		default:
			// dl may be stale: a reader that stopped the clock (claiming
			// an accepted connection's first frame, which it now serves)
			// after dl was loaded has cleared it first. Look again.
			if c.clockDeadline.Load() != dl {
				continue
			}
			c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: a frame it started did not arrive whole within frame_timeout %s", c.remote, kernel.ErrClosed, c.t.frameTimeout))
			return
		}
	}
}

func (c *conn) answered() {
	for {
		n := c.unanswered.Load()
		if n <= 0 || c.unanswered.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// startKeepalive makes the keepalive timer, with the first request
// written. The timer is made armed, not armed by a Reset: each change of a
// timer may wake the netpoller. Its first run may come before AfterFunc
// returns, and waits on kaMade for the assignment.
func (c *conn) startKeepalive() {
	c.kaMade.Lock()
	defer c.kaMade.Unlock()
	if c.kaTimer.Load() != nil || c.Err() != nil {
		return
	}
	c.kaSeen = c.lastRecv.Load()
	c.kaTimer.Store(time.AfterFunc(c.t.keepaliveInterval, c.keepalive))
}

// stopKeepalive stops the keepalive timer of a dying connection, if it was
// made; none is made after it, since the connection's death is set first.
func (c *conn) stopKeepalive() {
	c.kaMade.Lock()
	defer c.kaMade.Unlock()
	if t := c.kaTimer.Load(); t != nil {
		t.Stop()
	}
}

// keepalive probes the peer while the connection waits for an answer and
// hears nothing; see the package doc for why a reader alone is not enough.
// It runs on the keepalive timer, not a goroutine of its own, so that a
// connection costs one goroutine fewer to start and to wait for at Close;
// each run rearms the timer, so runs never overlap and kaSeen and kaPinged
// need no lock.
func (c *conn) keepalive() {
	c.kaMade.Lock() // startKeepalive has assigned kaTimer
	//lint:ignore SA2001 empty on purpose: a barrier
	c.kaMade.Unlock()
	if c.Err() != nil {
		return
	}
	now := c.lastRecv.Load()
	if c.kaPinged {
		c.kaPinged = false
		// With nobody reading, an answer may be sitting unread in the
		// socket: only a waiting reader that heard nothing proves silence.
		if now == c.kaSeen && c.reading.Load() {
			c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: no answer to keepalive within %s", c.remote, kernel.ErrPeerGone, c.t.keepaliveTimeout))
			return
		}
	}
	c.kaSeen = now
	if !c.reading.Load() || c.unanswered.Load() <= 0 {
		c.kaTimer.Load().Reset(c.t.keepaliveInterval)
		return
	}
	// Ping keepalive_interval after the last byte heard, not after the
	// first run that saw nothing new: data that came just after a run
	// would otherwise put the Ping off by up to a whole interval more.
	if quiet := time.Since(clockBase) - time.Duration(now); quiet < c.t.keepaliveInterval {
		c.kaTimer.Load().Reset(c.t.keepaliveInterval - quiet)
		return
	}
	_ = c.enqueue(&kernel.Frame{Type: kernel.FramePing}, nil) // an overflow kills the connection, which stops the timer
	c.signalWriter()
	c.kaPinged = true
	c.kaTimer.Load().Reset(c.t.keepaliveTimeout)
}
