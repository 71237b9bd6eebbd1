package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// The broken transport TestTransportCatchesBrokenTransports feeds the
// suite: tcp-lv with one defect at a time, each a hook of transportFaults.

// transportFaults are a broken transport's defects: each hook set replaces
// the tcp-lv behaviour it is named after.
type transportFaults struct {
	options           func(o *tcplv.Options)
	hidesCapabilities bool
	dial              func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error)
	accept            func(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error)
	closeListener     func(l *transportFaultyListener) error
	started           func(c *transportFaultyConn)
	read              func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error)
	write             func(c *transportFaultyConn, f *kernel.Frame) error
	close             func(c *transportFaultyConn) error
	done              func(c *transportFaultyConn) <-chan struct{}
	err               func(c *transportFaultyConn) error
	buffer            func(c *transportFaultyConn, n int) []byte
	recycle           func(c *transportFaultyConn, b []byte)
	// queue and closeWrite give the connections tcp-lv's QueueFrame and
	// CloseWrite, with these defects; without either, the connections
	// implement neither, and the checks of them are skipped.
	queue      func(c *transportFaultyConn, f *kernel.Frame) error
	closeWrite func(c *transportFaultyConn) error
	// writeContext gives the connections a WriteFrameContext
	// (kernel.ContextWriter), which tcp-lv has not, with this defect.
	writeContext func(ctx context.Context, c *transportFaultyConn, f *kernel.Frame) error
}

// transportBroken returns a factory of tcp-lv transports with faults.
// What a defect holds on to (a connection it will not close, a goroutine
// it leaks) is let go when t ends.
func transportBroken(t transportCleanups, faults transportFaults) kernel.Factory[kernel.Transport] {
	end := make(chan struct{})
	t.Cleanup(func() { close(end) })
	return kernel.NewFactory("broken-tcp-lv", "tcp-lv with a defect", tcplv.DefaultOptions, func(o *tcplv.Options) (kernel.Transport, error) {
		if faults.options != nil {
			faults.options(o)
		}
		o.Logger = slog.New(slog.DiscardHandler)
		inner, err := tcplv.New(o)
		if err != nil {
			return nil, err
		}
		tr := &transportFaulty{inner: inner, faults: &faults, end: end, accepted: make(map[string]chan struct{})}
		// Whatever a defect left open, or a call the suite gave up on
		// returned late, is closed before the defects let go.
		t.Cleanup(tr.closeAll)
		t.Cleanup(tr.closeFiles)
		if faults.hidesCapabilities {
			return tr, nil
		}
		return transportFaultyLending{tr}, nil
	})
}

type transportFaulty struct {
	inner  kernel.Transport
	faults *transportFaults
	end    <-chan struct{}

	mu        sync.Mutex
	conns     []*transportFaultyConn
	listeners []kernel.Listener
	accepted  map[string]chan struct{} // by the dialling end's address
	files     []io.Closer              // descriptors a defect leaked, closed at the end
}

// transportFaultyLending declares what tcp-lv declares.
type transportFaultyLending struct{ *transportFaulty }

func (transportFaultyLending) LendsMemory() bool { return true }

func (tr *transportFaulty) Listen(ctx context.Context, addr string) (kernel.Listener, error) {
	l, err := tr.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	tr.mu.Lock()
	tr.listeners = append(tr.listeners, l)
	tr.mu.Unlock()
	return &transportFaultyListener{Listener: l, tr: tr}, nil
}

func (tr *transportFaulty) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	if tr.faults.dial != nil {
		return tr.faults.dial(ctx, tr, addr)
	}
	c, err := tr.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return tr.wrap(c).optional(), nil
}

// closeFiles closes what defects leaked on purpose.
func (tr *transportFaulty) closeFiles() {
	tr.mu.Lock()
	files := tr.files
	tr.files = nil
	tr.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
}

func (tr *transportFaulty) wrap(inner kernel.Conn) *transportFaultyConn {
	c := &transportFaultyConn{Conn: inner, tr: tr, never: make(chan struct{}), localDone: make(chan struct{})}
	c.touch()
	tr.mu.Lock()
	tr.conns = append(tr.conns, c)
	tr.mu.Unlock()
	if tr.faults.started != nil {
		tr.faults.started(c)
	}
	return c
}

// closeAll closes every connection and listener the transport made,
// bypassing their defects.
func (tr *transportFaulty) closeAll() {
	tr.mu.Lock()
	conns, listeners := tr.conns, tr.listeners
	tr.mu.Unlock()
	for _, c := range conns {
		c.Conn.Close()
	}
	for _, l := range listeners {
		l.Close()
	}
}

// acceptedSignal is closed once the listener accepted the connection
// dialled from addr.
func (tr *transportFaulty) acceptedSignal(addr string) chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ch, ok := tr.accepted[addr]
	if !ok {
		ch = make(chan struct{})
		tr.accepted[addr] = ch
	}
	return ch
}

// markAccepted closes acceptedSignal(addr), if no earlier connection from
// the same address did.
func (tr *transportFaulty) markAccepted(addr string) {
	ch := tr.acceptedSignal(addr)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

type transportFaultyListener struct {
	kernel.Listener
	tr        *transportFaulty
	closeOnce sync.Once

	mu      sync.Mutex
	waiting bool                  // a goroutine of transportAcceptWithWaiter is in Accept
	results chan transportConnErr // what it accepted
}

func (l *transportFaultyListener) Accept(ctx context.Context) (kernel.Conn, error) {
	if l.tr.faults.accept != nil {
		return l.tr.faults.accept(ctx, l)
	}
	c, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	l.tr.markAccepted(c.RemoteAddr())
	return l.tr.wrap(c).optional(), nil
}

func (l *transportFaultyListener) Close() error {
	if l.tr.faults.closeListener != nil {
		return l.tr.faults.closeListener(l)
	}
	return l.Listener.Close()
}

type transportFaultyConn struct {
	kernel.Conn
	tr        *transportFaulty
	never     chan struct{} // never closed
	localDone chan struct{} // closed by Close, whatever the defect
	closeOnce sync.Once

	mu          sync.Mutex
	closed      bool
	stash       *kernel.Frame
	interrupted bool
	shared      []byte
	stale       []byte          // a recycled buffer, handed out again
	refused     bool            // a frame over the maximum was refused last
	held        []*kernel.Frame // queued frames a defect holds back
	active      atomic.Int64    // when a frame last went out or came in, in Unix nanoseconds
}

func (c *transportFaultyConn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	defer c.touch()
	if c.tr.faults.read != nil {
		return c.tr.faults.read(ctx, c)
	}
	return c.Conn.ReadFrame(ctx)
}

func (c *transportFaultyConn) WriteFrame(f *kernel.Frame) error {
	c.touch()
	if c.tr.faults.write != nil {
		return c.tr.faults.write(c, f)
	}
	return c.Conn.WriteFrame(f)
}

// optional returns c with QueueFrame and CloseWrite when a defect is in
// either, else c, which has neither.
func (c *transportFaultyConn) optional() kernel.Conn {
	if c.tr.faults.writeContext != nil {
		return transportContextConn{c}
	}
	if c.tr.faults.queue == nil && c.tr.faults.closeWrite == nil {
		return c
	}
	return transportOptionalConn{c}
}

// transportOptionalConn is a connection with tcp-lv's QueueFrame and
// CloseWrite, or the defects in their place.
type transportOptionalConn struct{ *transportFaultyConn }

func (c transportOptionalConn) QueueFrame(f *kernel.Frame) error {
	c.touch()
	if c.tr.faults.queue != nil {
		return c.tr.faults.queue(c.transportFaultyConn, f)
	}
	return c.Conn.(kernel.FrameQueuer).QueueFrame(f)
}

func (c transportOptionalConn) CloseWrite() error {
	if c.tr.faults.closeWrite != nil {
		return c.tr.faults.closeWrite(c.transportFaultyConn)
	}
	return c.Conn.(kernel.HalfCloser).CloseWrite()
}

// transportContextConn is a connection with a defective WriteFrameContext.
type transportContextConn struct{ *transportFaultyConn }

func (c transportContextConn) WriteFrameContext(ctx context.Context, f *kernel.Frame) error {
	c.touch()
	return c.tr.faults.writeContext(ctx, c.transportFaultyConn, f)
}

// touch records activity, for defects that act on idleness.
func (c *transportFaultyConn) touch() { c.active.Store(time.Now().UnixNano()) }

func (c *transportFaultyConn) Close() error {
	if c.tr.faults.close != nil {
		return c.tr.faults.close(c)
	}
	return c.Conn.Close()
}

func (c *transportFaultyConn) Done() <-chan struct{} {
	if c.tr.faults.done != nil {
		return c.tr.faults.done(c)
	}
	return c.Conn.Done()
}

func (c *transportFaultyConn) Err() error {
	if c.tr.faults.err != nil {
		return c.tr.faults.err(c)
	}
	return c.Conn.Err()
}

// isClosed reports whether closeMarked has closed the connection.
func (c *transportFaultyConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// closeMarked closes the connection and reports whether Close had been
// called on it before.
func (c *transportFaultyConn) closeMarked() (again bool, err error) {
	c.mu.Lock()
	again, c.closed = c.closed, true
	c.mu.Unlock()
	return again, c.Conn.Close()
}

func (c *transportFaultyConn) Buffer(n int) []byte {
	if c.tr.faults.buffer != nil {
		return c.tr.faults.buffer(c, n)
	}
	return c.Conn.Buffer(n)
}

func (c *transportFaultyConn) Recycle(b []byte) {
	if c.tr.faults.recycle != nil {
		c.tr.faults.recycle(c, b)
		return
	}
	c.Conn.Recycle(b)
}

// transportSwap returns the second of two frames that are ready together
// first.
func transportSwap(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.stash; f != nil {
		c.stash = nil
		return f, nil
	}
	f, err := c.Conn.ReadFrame(ctx)
	if err != nil || c.Conn.(kernel.BufferedReader).Buffered() == 0 {
		return f, err
	}
	g, err := c.Conn.ReadFrame(ctx)
	if err != nil {
		return f, nil
	}
	c.stash = f
	return g, nil
}

// transportLoseAfterInterrupt drops the frame that follows a read its
// context interrupted, as if the part read so far had been thrown away.
func transportLoseAfterInterrupt(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.Conn.ReadFrame(ctx)
	if err != nil {
		c.interrupted = c.interrupted || ctx.Err() != nil
		return nil, err
	}
	if c.interrupted {
		c.interrupted = false
		f.Release()
		return c.Conn.ReadFrame(ctx)
	}
	return f, nil
}

// transportCloseLocally marks the connection closed but keeps its socket
// open until the test ends: the peer is never told.
func transportCloseLocally(c *transportFaultyConn) error {
	c.closeOnce.Do(func() {
		close(c.localDone)
		go func() { <-c.tr.end; c.Conn.Close() }()
	})
	return nil
}

// transportCloseLocallyToo closes the socket and marks the connection
// closed for transportDoneLocally.
func transportCloseLocallyToo(c *transportFaultyConn) error {
	c.closeOnce.Do(func() { close(c.localDone) })
	return c.Conn.Close()
}

// transportDoneLocally closes Done on Close only, never on failure.
func transportDoneLocally(c *transportFaultyConn) <-chan struct{} { return c.localDone }

func transportClosedErr() error { return fmt.Errorf("broken transport: %w", kernel.ErrClosed) }

// transportReadUntilClosed is a ReadFrame that transportCloseLocally wakes.
func transportReadUntilClosed(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
	select {
	case <-c.localDone:
		return nil, transportClosedErr()
	default:
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.localDone:
			cancel()
		case <-ctx.Done():
		}
	}()
	f, err := c.Conn.ReadFrame(ctx)
	select {
	case <-c.localDone:
		if f != nil {
			f.Release()
		}
		return nil, transportClosedErr()
	default:
		return f, err
	}
}

func transportWriteUntilClosed(c *transportFaultyConn, f *kernel.Frame) error {
	select {
	case <-c.localDone:
		c.Conn.Recycle(f.Payload)
		return transportClosedErr()
	default:
		return c.Conn.WriteFrame(f)
	}
}

// transportAfterRefusal writes as tcp-lv does until a frame over the
// maximum is refused; the frame after it is dropped (its payload
// recycled) and its WriteFrame returns then. once says the defect spends
// itself on that one frame; otherwise every later frame goes the same way.
func transportAfterRefusal(once bool, then error) func(c *transportFaultyConn, f *kernel.Frame) error {
	return func(c *transportFaultyConn, f *kernel.Frame) error {
		c.mu.Lock()
		refused := c.refused
		if once {
			c.refused = false
		}
		c.mu.Unlock()
		if refused {
			c.Conn.Recycle(f.Payload)
			return then
		}
		err := c.Conn.WriteFrame(f)
		if errors.Is(err, kernel.ErrFrameTooLarge) {
			c.mu.Lock()
			c.refused = true
			c.mu.Unlock()
		}
		return err
	}
}

// transportDialAwaitingAccept waits, ignoring ctx, until the listener
// accepted the connection.
func transportDialAwaitingAccept(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
	return transportDialThenAwaitAccept(ctx, context.Background(), tr, addr)
}

// transportDialThenAwaitAccept dials addr under ctx, then waits until the
// listener accepted the connection, or until wait ends.
func transportDialThenAwaitAccept(ctx, wait context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
	c, err := tr.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	select {
	case <-tr.acceptedSignal(c.LocalAddr()):
		return tr.wrap(c), nil
	case <-wait.Done():
		c.Close()
		return nil, wait.Err()
	case <-tr.end:
		c.Close()
		return nil, errors.New("never accepted")
	}
}

// transportDialAwaitingAcceptByDeadline waits until the listener accepted
// the connection or ctx's deadline passed, as a transport that sets its
// socket's deadline from ctx and never watches ctx.Done would: a
// cancellation does not end it.
func transportDialAwaitingAcceptByDeadline(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		defer cancel()
	} else {
		ctx = context.WithoutCancel(ctx)
	}
	return transportDialThenAwaitAccept(ctx, ctx, tr, addr)
}

// transportReadIntoSharedBuffer copies every payload into one buffer per
// connection, reused by the next read whether or not the frame was
// released.
func transportReadIntoSharedBuffer(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
	f, err := c.Conn.ReadFrame(ctx)
	if err != nil {
		return nil, err
	}
	return transportShare(c, f), nil
}

// transportWriteFromOwnBuffer copies a payload in a buffer tcp-lv did not
// hand out into one it did, before writing.
func transportWriteFromOwnBuffer(c *transportFaultyConn, f *kernel.Frame) error {
	g := transportHeader(f)
	g.Payload = append(c.Conn.Buffer(len(f.Payload)), f.Payload...)
	return c.Conn.WriteFrame(g)
}
