package tcplv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The read side: one goroutine at a time inside ReadFrame decodes frames
// from the buffered socket, answers Pings and enforces the read limits.

// Buffered reports the received bytes ReadFrame can consume without
// waiting; only the reader may call it.
func (c *conn) Buffered() int { return c.br.Buffered() }

// ReadFrame returns the next Request, Response, Cancel, GoAway or stream
// frame; it answers Pings and swallows Pongs on the way. When ctx ends
// first it returns ctx's error and keeps the partly read frame for the
// next call.
func (c *conn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		c.uncork() // the next reader may be a while
		return nil, err
	}
	// A read deadline in the past wakes a blocked read, so no goroutine
	// waits on ctx for us. It is armed only before a read that may block:
	// a frame already in the buffer (most of them, with many callers) is
	// taken without the lock and allocations of context.AfterFunc.
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	c.reading.Store(true)
	defer c.reading.Store(false)
	for {
		if !c.frameBuffered() {
			c.uncork()
			if stop == nil && ctx.Done() != nil {
				stop = context.AfterFunc(ctx, c.interrupt)
			}
		}
		pf, err := c.readFrame()
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) || c.Err() != nil {
				return nil, c.readFailed(err)
			}
			// Interrupted by ctx, or by an earlier call's AfterFunc that
			// fired late. Clearing first, then checking ctx, cannot miss a
			// cancellation: one landing after the check sets the deadline
			// again.
			c.nc.SetReadDeadline(time.Time{})
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		switch pf.f.Type {
		case kernel.FramePing:
			c.answerPing(pf)
			continue
		case kernel.FramePong:
			c.pool.putFrame(pf)
			continue
		case kernel.FrameResponse:
			c.answered()
		}
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

// frameBuffered reports whether readFrame can complete without reading
// from the socket. A length it cannot accept counts as buffered: readFrame
// fails on it at once.
func (c *conn) frameBuffered() bool {
	if c.body != nil {
		return c.br.Buffered() >= len(c.body)-c.got
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
		prefix, err := c.br.Peek(kernel.FramePrefixLen)
		if err != nil {
			return nil, err
		}
		n, err := kernel.ReadFrameLength(prefix, c.t.maxFrame)
		if err != nil {
			return nil, c.protocolError(err)
		}
		c.br.Discard(kernel.FramePrefixLen)
		c.body, c.got = c.pool.Get(n)[:n], 0
	}
	for c.got < len(c.body) {
		n, err := c.br.Read(c.body[c.got:])
		c.got += n
		if err != nil && c.got < len(c.body) {
			return nil, err
		}
	}
	pf := c.pool.getFrame(c)
	pf.body, c.body = c.body, nil
	if err := kernel.DecodeFrame(pf.body, &pf.f, &c.in); err != nil {
		c.pool.putFrame(pf)
		return nil, c.protocolError(err)
	}
	return pf, nil
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
// writes itself: a peer that does not read must not stall our reading.
func (c *conn) answerPing(pf *pooledFrame) {
	body := pf.body
	pf.body = nil
	c.enqueue(&kernel.Frame{Type: kernel.FramePong, CallID: pf.f.CallID, Payload: pf.f.Payload}, body)
	c.pool.putFrame(pf)
	c.signalWriter()
}

func (c *conn) answered() {
	for {
		n := c.unanswered.Load()
		if n <= 0 || c.unanswered.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// keepalive probes the peer while the connection waits for an answer and
// hears nothing; see the package doc for why a reader alone is not enough.
func (c *conn) keepalive() {
	timer := time.NewTimer(c.t.keepaliveInterval)
	defer timer.Stop()
	seen := c.received.Load()
	for {
		select {
		case <-c.done:
			return
		case <-timer.C:
		}
		now := c.received.Load()
		if now != seen || !c.reading.Load() || c.unanswered.Load() <= 0 {
			seen = now
			timer.Reset(c.t.keepaliveInterval)
			continue
		}
		c.enqueue(&kernel.Frame{Type: kernel.FramePing}, nil)
		c.signalWriter()
		timer.Reset(c.t.keepaliveTimeout)
		select {
		case <-c.done:
			return
		case <-timer.C:
		}
		// With nobody reading, an answer may be sitting unread in the
		// socket: only a waiting reader that heard nothing proves silence.
		if now := c.received.Load(); now == seen && c.reading.Load() {
			c.fail(slog.LevelWarn, fmt.Errorf("tcp-lv: connection %s: %w: no answer to keepalive within %s", c.remote, kernel.ErrPeerGone, c.t.keepaliveTimeout))
			return
		}
		seen = c.received.Load()
		timer.Reset(c.t.keepaliveInterval)
	}
}
