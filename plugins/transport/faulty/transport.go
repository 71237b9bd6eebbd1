package faulty

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

var (
	_ kernel.Transport             = (*transport)(nil)
	_ kernel.TransportCapabilities = (*transport)(nil)
	_ io.Closer                    = (*transport)(nil)
	_ kernel.Listener              = (*listener)(nil)
	_ kernel.Conn                  = (*conn)(nil)
	_ kernel.BufferedReader        = bufferedConn{}
	_ kernel.FrameQueuer           = queuingConn{}
	_ kernel.HalfCloser            = halfClosingConn{}
)

// transport wraps the transport its options name.
type transport struct {
	inner kernel.Transport
	o     *Options
	log   *slog.Logger
	dial  bool // faults on the connections Dial makes
	lsn   bool // faults on the connections listeners accept

	dials, accepts atomic.Uint64 // connection numbers, for the seeds
}

// Generator streams of the two sides, so that the first dialled and the
// first accepted connection do not draw the same faults.
const (
	dialStream   = 1
	listenStream = 2
)

// New builds the wrapped transport by name and the wrapper around it.
func New(o *Options) (kernel.Transport, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	inner, err := kernel.NewTransport(o.Transport.Name, o.Transport.Options, "")
	if err != nil {
		return nil, innerError(err)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	on := o.faultsOn()
	return &transport{inner: inner, o: o, log: log,
		dial: on && o.Side != SideListen, lsn: on && o.Side != SideDial}, nil
}

// LendsMemory is the wrapped transport's: buffers and read payloads are
// its own, and the wrapper gives every one it does not send back to it.
func (t *transport) LendsMemory() bool {
	c, ok := t.inner.(kernel.TransportCapabilities)
	return ok && c.LendsMemory()
}

// Close closes the wrapped transport if it holds resources.
func (t *transport) Close() error {
	if c, ok := t.inner.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (t *transport) Listen(ctx context.Context, addr string) (kernel.Listener, error) {
	ln, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: ln, t: t}, nil
}

func (t *transport) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	c, err := t.inner.Dial(ctx, addr)
	if err != nil || !t.dial {
		return c, err
	}
	return t.wrap(c, dialStream, t.dials.Add(1)), nil
}

// wrap puts the faults around c, offering the optional interfaces c
// offers and no others: the wrapper can honour each only through c's.
func (t *transport) wrap(c kernel.Conn, stream, seq uint64) kernel.Conn {
	w := newConn(c, newFaults(t.o, stream, seq), t.log)
	_, b := c.(kernel.BufferedReader)
	_, q := c.(kernel.FrameQueuer)
	_, h := c.(kernel.HalfCloser)
	switch {
	case b && q && h:
		return struct {
			*conn
			bufferedConn
			queuingConn
			halfClosingConn
		}{w, bufferedConn{w}, queuingConn{w}, halfClosingConn{w}}
	case b && q:
		return struct {
			*conn
			bufferedConn
			queuingConn
		}{w, bufferedConn{w}, queuingConn{w}}
	case b && h:
		return struct {
			*conn
			bufferedConn
			halfClosingConn
		}{w, bufferedConn{w}, halfClosingConn{w}}
	case q && h:
		return struct {
			*conn
			queuingConn
			halfClosingConn
		}{w, queuingConn{w}, halfClosingConn{w}}
	case b:
		return struct {
			*conn
			bufferedConn
		}{w, bufferedConn{w}}
	case q:
		return struct {
			*conn
			queuingConn
		}{w, queuingConn{w}}
	case h:
		return struct {
			*conn
			halfClosingConn
		}{w, halfClosingConn{w}}
	}
	return w
}

type bufferedConn struct{ w *conn }

func (b bufferedConn) Buffered() int { return b.w.buffered() }

type queuingConn struct{ w *conn }

func (q queuingConn) QueueFrame(f *kernel.Frame) error { return q.w.queueFrame(f) }

type halfClosingConn struct{ w *conn }

func (h halfClosingConn) CloseWrite() error { return h.w.closeWriteHalf() }

// listener wraps the connections it accepts when the faults are on the
// listening side.
type listener struct {
	kernel.Listener
	t *transport
}

func (l *listener) Accept(ctx context.Context) (kernel.Conn, error) {
	c, err := l.Listener.Accept(ctx)
	if err != nil || !l.t.lsn {
		return c, err
	}
	return l.t.wrap(c, listenStream, l.t.accepts.Add(1)), nil
}
