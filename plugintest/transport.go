package plugintest

import (
	"context"
	"errors"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// TransportConfig says how to exercise one transport. Its zero value suits
// a TCP transport with default options.
type TransportConfig struct {
	// Options is the options block every transport under test is built
	// from, as a config file would give it; nil means the defaults.
	Options map[string]any
	// Address returns a fresh address to listen on. dir is a new, short
	// temporary directory, for transports whose addresses are socket paths
	// (which the system limits to about 100 bytes). Nil means
	// "127.0.0.1:0".
	Address func(dir string) string
	// WrongAddress returns an address no listener can ever be at (malformed,
	// or naming something that does not exist); dialling it must fail
	// promptly. Nil means a string that is neither host:port nor an
	// existing path.
	WrongAddress func(dir string) string
	// MaxFrameSize is the maximum frame size the transport is configured
	// with (the largest value of a frame's length field, see
	// docs/protocol.md); it must match Options. 0 means
	// kernel.DefaultMaxFrameSize.
	MaxFrameSize int
	// Patience bounds every wait for something that must happen (a frame
	// arriving, a blocked call returning after Close) and every wait for a
	// call that must return once its context is done. 0 means 10s; raise it
	// for a transport on a slow machine.
	Patience time.Duration
	// LargeFrame is the frame length (as the length field counts it) from
	// which the transport takes another path: shm-ring sends a frame whose
	// record (the frame plus 16 bytes, rounded up to 8) exceeds a quarter
	// of its ring_size in chunks; another transport may stop pooling
	// buffers above some size. Frames/Sizes sends frames just below, at
	// and just above it, and Memory/HeldFrame and Memory/HeldBuffer hold
	// ones above it. 0 means the transport has no such path; otherwise it
	// must leave room under MaxFrameSize for a frame above it.
	LargeFrame int
	// MaxMetadataEntries and MaxMetadataBytes are the metadata limits the
	// transport is configured with (kernel.FrameLimits); they must match
	// Options. 0 means kernel.DefaultMaxMetadataEntries and
	// kernel.DefaultMaxMetadataBytes. Frames/* keep within them and
	// Frames/MetadataLimits checks both sides of each.
	MaxMetadataEntries int
	MaxMetadataBytes   int
	// Idle is how long Idle/* leave a healthy connection unused before
	// using it again. Set it above what Options make the transport probe
	// or time out after (tcp-lv: keepalive_interval plus
	// keepalive_timeout), so that keepalive runs while the connection
	// waits. 0 means 250ms. The -plugintest.idle flag overrides it, for a
	// longer run against a transport's default keepalive.
	Idle time.Duration
}

// Transport certifies the transport f builds: it runs the subtests below
// against transports built from cfg.Options, each on connections of its
// own, and fails the one whose property breaks.
//
//   - Lifecycle, Options: the checks every plugin kind shares; "use" listens,
//     dials and exchanges a frame.
//   - Frames/{0B,1B,1KiB,64KiB,1MiB,Max}: a frame of that payload size
//     crosses intact both ways, every header field included (Max is the
//     largest payload that fits cfg.MaxFrameSize; larger sizes are skipped).
//     Frames/Sizes: frames whose length lies on both sides of every power
//     of two from 128 bytes to the maximum (counted with and without the
//     4-byte prefix), of every 8-byte alignment, and of cfg.LargeFrame.
//     Frames/MaxLargeHeader: a frame of exactly the maximum length, half of
//     it header. Frames/Widths: header values and lengths on both sides of
//     every uvarint width (call ids, timeouts, codes, credits; method,
//     codec, message, metadata key and value lengths; metadata counts).
//     Frames/Strings: empty, non-ASCII, control and separator-like strings
//     in every header field, keys differing only in case, binary metadata,
//     long strings and many metadata entries. Frames/Types: every frame
//     type with the fields it carries. Frames/InOrder: frames of one call
//     arrive in the order written. Frames/ReusedFrame: frames written
//     both ways from one kernel.Frame, reset and refilled as soon as each
//     WriteFrame returns (as the engine sends a stream's messages), each
//     followed by a fresh frame, arrive as written: WriteFrame does not
//     keep f. Frames/MetadataLimits: frames at
//     cfg.MaxMetadataEntries and cfg.MaxMetadataBytes cross; one over
//     either is refused as TooLarge frames are (with an error wrapping
//     kernel.ErrMetadataTooLarge), or the receiver closes the connection.
//   - Concurrent/Calls: 64 goroutines write frames of their own call over one
//     connection, the peer echoes them from as many goroutines, and each call
//     gets its own frames back, in order.
//   - TooLarge/{Refused,RefusedFromServer,LargeHeader}: a frame one byte
//     over the maximum (from either end; with a header half the maximum) is
//     never delivered: WriteFrame refuses it with an error wrapping
//     kernel.ErrFrameTooLarge, and then either that error is a
//     *kernel.Status and the connection carries the next frames both ways,
//     or the connection is dead (Done closed, Err set), as the kernel
//     takes any other error to mean; or the receiver closes the connection.
//     TooLarge/OtherConnsWork: other connections are unaffected.
//   - Close/UnblocksRead, Close/UnblocksPeerRead: Close wakes a pending
//     ReadFrame on its own side (error wrapping kernel.ErrClosed) and on the
//     peer's. Close/UnblocksWrite, Close/UnblocksPeerWrite: the same for a
//     WriteFrame blocked on a peer that reads nothing.
//     Close/OperationsFail: ReadFrame and WriteFrame after Close fail with
//     kernel.ErrClosed, Done is closed and Err is set. Close/Twice: Close
//     is idempotent and safe from two goroutines at once; each Close
//     returns within the patience and does not panic.
//     Close/UnblocksAccept: a listener's Close wakes Accept with
//     kernel.ErrClosed. Close/ListenerLeavesConns: accepted connections
//     outlive their listener.
//   - PeerGone/{ServerNotices,ClientNotices}: when the peer's connection
//     closes, ReadFrame fails, Done closes and Err wraps kernel.ErrPeerGone.
//   - Dial/{ClosedAddress,WrongAddress}: dialling fails promptly, not by
//     waiting out the deadline. Dial/{Cancelled,Expired}: Dial honours a done
//     context. Dial/{NotAccepted,NotAcceptedCancelled}: Dial returns by
//     its deadline, and once its context is canceled, even when the
//     listener never accepts (the engine dials on a caller's goroutine).
//   - Deadline/{ReadCancelled,ReadExpires}: ReadFrame returns the context's
//     error, and the connection still delivers the next frame.
//     Deadline/ReadResumes: reads interrupted again and again, mid-frame
//     included, lose no byte. Deadline/Accept: the same for Accept.
//   - Idle/Unused: a connection left with nothing pending for cfg.Idle is
//     alive and carries frames both ways. Idle/AwaitingAnswer: a request
//     answered only after cfg.Idle, while both ends wait in ReadFrame as
//     the kernel's do, gets its answer, and the connection lives on.
//   - Leaks/{ListenerAndConns,FailedDial,CancelledDial,CancelledAccept}: no
//     goroutine (as go.uber.org/goleak checks it) and, on Linux, no file
//     descriptor outlives the transport and what it made, after
//     connections ended in every way, dials that failed where nothing
//     listens, dials cancelled or expired before and while they ran, and
//     Accepts cancelled or expired before and while they waited.
//   - Memory/Buffer: Buffer gives the capacity asked for, on both sides of
//     every power of two, and Buffer and Recycle round trip.
//     Memory/ReleaseAfterClose: a frame released after its connection
//     closed is harmless. Memory/HeldFrame: a received frame held
//     unreleased does not change while frames of its size flow both ways,
//     at sizes up to above cfg.LargeFrame and 1MiB. Memory/HeldBuffer: a
//     Buffer neither written nor recycled is not handed out again. Both
//     apply to every transport: one that does not declare
//     kernel.TransportCapabilities.LendsMemory must not reuse its memory
//     at all.
//   - QueueFrame/Alone, QueueFrame/InOrder: for a connection that
//     implements kernel.FrameQueuer, a frame queued with nothing written
//     after it arrives (the server queues the last answer of a burst), and
//     frames of one call queued and written in turn arrive in the order
//     sent. Skipped for other connections.
//   - HalfClose/SendsThenEnds, HalfClose/ReadsOn: for a connection that
//     implements kernel.HalfCloser, CloseWrite sends every frame written
//     or queued before it, then the peer's ReadFrame fails rather than
//     waiting; frames from the peer can still be read after CloseWrite,
//     and once the peer closes, Done closes (a draining server waits for
//     it). Skipped for other connections.
//   - ContextWrite: for a connection that implements kernel.ContextWriter,
//     a WriteFrameContext waiting on a peer that reads nothing returns
//     once its context is canceled, with a *kernel.Status with code
//     Canceled (refused) or nil (handed on), the connection lives on, and
//     the peer reads every frame written before it, nothing of a refused
//     frame (a handed-on one whole), and the next frame whole. Skipped for
//     other connections.
//
// Errors wrap the sentinel or context error named, not a socket's own. A
// ReadFrame that returns neither a frame nor an error fails whichever
// check it happens in.
//
// The leak checks count every goroutine started and descriptor opened
// while they run, so Transport must not run in parallel with other tests.
func Transport(t *testing.T, f kernel.Factory[kernel.Transport], cfg TransportConfig) {
	t.Helper()
	transportSuite(wrap(t), f, cfg)
}

func transportSuite(t tb, f kernel.Factory[kernel.Transport], cfg TransportConfig) {
	t.Helper()
	e := newTransportEnv(f, cfg)
	if e.capped(1<<10) < 1<<10 {
		t.Fatalf("MaxFrameSize %d leaves no room for the suite's 1KiB frames; configure at least 2KiB", e.max)
	}
	if cfg.LargeFrame < 0 || cfg.LargeFrame+transportLargeMargin > e.max {
		t.Fatalf("LargeFrame %d leaves no room under MaxFrameSize %d for the frames above it that the suite sends (up to %d bytes more); "+
			"configure a MaxFrameSize (and the matching option) above LargeFrame, or LargeFrame 0 if the transport has no other path for large frames",
			cfg.LargeFrame, e.max, transportLargeMargin)
	}
	lifecycle(t, f, cfg.Options, e.use)
	t.Run("Frames", e.frames)
	t.Run("Concurrent", func(t tb) { t.Run("Calls", e.concurrentCalls) })
	t.Run("TooLarge", e.tooLarge)
	t.Run("Close", e.close)
	t.Run("PeerGone", e.peerGone)
	t.Run("Dial", e.dial)
	t.Run("Deadline", e.deadline)
	t.Run("Idle", e.idleChecks)
	t.Run("Leaks", e.leakChecks)
	t.Run("Memory", e.memory)
	t.Run("QueueFrame", e.queueFrame)
	t.Run("HalfClose", e.halfClose)
	t.Run("ContextWrite", e.contextWrite)
}

// transportEnv builds what the subtests exercise: transports, listeners
// and connected pairs, each closed when its subtest ends.
type transportEnv struct {
	f        kernel.Factory[kernel.Transport]
	cfg      TransportConfig
	max      int
	mdLimits kernel.FrameLimits // with the defaults filled in
	patience time.Duration
	idle     time.Duration
}

func newTransportEnv(f kernel.Factory[kernel.Transport], cfg TransportConfig) *transportEnv {
	e := &transportEnv{f: f, cfg: cfg, max: cfg.MaxFrameSize, patience: cfg.Patience, idle: cfg.Idle}
	if e.max <= 0 {
		e.max = kernel.DefaultMaxFrameSize
	}
	e.mdLimits = kernel.FrameLimits{MaxMetadataEntries: cfg.MaxMetadataEntries, MaxMetadataBytes: cfg.MaxMetadataBytes}
	if e.mdLimits.MaxMetadataEntries <= 0 {
		e.mdLimits.MaxMetadataEntries = kernel.DefaultMaxMetadataEntries
	}
	if e.mdLimits.MaxMetadataBytes <= 0 {
		e.mdLimits.MaxMetadataBytes = kernel.DefaultMaxMetadataBytes
	}
	if e.patience <= 0 {
		e.patience = 10 * time.Second
	}
	if e.idle <= 0 {
		e.idle = 250 * time.Millisecond
	}
	if *transportIdleFlag > 0 {
		e.idle = *transportIdleFlag
	}
	return e
}

// fits reports whether f stays within the maximum frame size and the
// metadata limits, so that a check meant for frames that must cross can
// send it.
func (e *transportEnv) fits(f *kernel.Frame) bool {
	return transportBodyLen(f)+len(f.Payload) <= e.max && e.mdLimits.Check(f) == nil
}

// maxPayload is the largest payload a frame with f's header can carry.
func (e *transportEnv) maxPayload(f *kernel.Frame) int {
	return e.max - (kernel.FrameHeaderLen(f) - kernel.FramePrefixLen)
}

// capped is n, or less if a payload of n bytes would not fit the maximum
// frame size in any frame the suite sends.
func (e *transportEnv) capped(n int) int {
	return min(n, e.maxPayload(transportSample(nil, 1<<63, 1<<24, 0)))
}

// dir makes a short temporary directory: t.TempDir's paths, named after
// deeply nested subtests, can exceed what a Unix socket path may hold.
func (e *transportEnv) dir(t tb) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pt")
	if err != nil {
		t.Fatalf("temporary directory for an address: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (e *transportEnv) address(t tb) string {
	if e.cfg.Address == nil {
		return "127.0.0.1:0"
	}
	return e.cfg.Address(e.dir(t))
}

func (e *transportEnv) wrongAddress(t tb) string {
	if e.cfg.WrongAddress == nil {
		return "plugintest.invalid/no-such-address"
	}
	return e.cfg.WrongAddress(e.dir(t))
}

// transport builds a transport from the configured options; it is closed
// (if it is an io.Closer) when t ends.
func (e *transportEnv) transport(t tb) kernel.Transport {
	t.Helper()
	tr := build(t, e.f, e.cfg.Options)
	t.Cleanup(func() { closePlugin(tr) })
	return tr
}

// listen listens on a fresh address; the listener is closed when t ends.
func (e *transportEnv) listen(t tb, tr kernel.Transport) kernel.Listener {
	t.Helper()
	addr := e.address(t)
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	l, err := tr.Listen(ctx, addr)
	if err != nil {
		t.Fatalf("Listen(%q): %v", addr, err)
	}
	transportCloseAtEnd(t, "listener", l.Close)
	return l
}

// transportPair is a connection, both of its ends, and how it was made.
type transportPair struct {
	tr             kernel.Transport
	l              kernel.Listener
	client, server kernel.Conn
}

// pair builds a transport, listens and connects; everything is closed when
// t ends.
func (e *transportEnv) pair(t tb) transportPair {
	t.Helper()
	tr := e.transport(t)
	l := e.listen(t, tr)
	client, server := e.connect(t, tr, l)
	return transportPair{tr: tr, l: l, client: client, server: server}
}

type transportConnErr struct {
	c   kernel.Conn
	err error
}

// connect connects to l and closes both ends when t ends.
func (e *transportEnv) connect(t tb, tr kernel.Transport, l kernel.Listener) (client, server kernel.Conn) {
	t.Helper()
	client, server = e.dialAccept(t, tr, l)
	transportCloseAtEnd(t, "connection", client.Close)
	transportCloseAtEnd(t, "connection", server.Close)
	return client, server
}

// dialAccept dials l and accepts at the same time (a transport may finish
// its handshake in either); closing the two ends is the caller's.
func (e *transportEnv) dialAccept(t tb, tr kernel.Transport, l kernel.Listener) (client, server kernel.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	accepted := make(chan transportConnErr, 1)
	transportGo(t, func() {
		a := transportConnErr{err: errors.New("the transport panicked in Accept")}
		defer func() { accepted <- a }() // a panic must not leave the wait below blocked
		a.c, a.err = l.Accept(ctx)
	})
	dialed, ok := transportDo(t, 2*e.patience, func() transportConnErr {
		c, err := tr.Dial(ctx, l.Addr())
		return transportConnErr{c, err}
	})
	if !ok {
		t.Fatalf("Dial(%q) did not return within %s, though its context expired", l.Addr(), 2*e.patience)
	}
	if dialed.err != nil {
		cancel() // no connection is coming: stop Accept waiting for one
	}
	a, ok := transportDo(t, 2*e.patience, func() transportConnErr { return <-accepted })
	if ok && a.err == nil && dialed.err == nil {
		return dialed.c, a.c
	}
	if dialed.err == nil {
		dialed.c.Close()
	}
	if ok && a.err == nil {
		a.c.Close()
	}
	switch {
	case dialed.err != nil:
		t.Fatalf("Dial(%q): %v", l.Addr(), dialed.err)
	case !ok:
		t.Fatalf("Accept on %q did not return within %s of a successful Dial, though its context expired", l.Addr(), 2*e.patience)
	default:
		t.Fatalf("Accept on %q while a Dial succeeded: %v", l.Addr(), a.err)
	}
	return nil, nil
}

// transportCloseAtEnd calls close when t ends. A Close that panics (on a
// connection or listener the subtest closed already) is reported, instead
// of taking the test binary down.
func transportCloseAtEnd(t tb, what string, close func() error) {
	t.Cleanup(func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("%s Close, called again as the test ended, panicked: %v; Close must be idempotent", what, v)
			}
		}()
		close()
	})
}

// use is the lifecycle's brief exercise: listen, dial, and one frame each
// way.
func (e *transportEnv) use(t tb, tr kernel.Transport) {
	t.Helper()
	l := e.listen(t, tr)
	client, server := e.connect(t, tr, l)
	e.exchange(t, client, server, 1, 100)
	e.exchange(t, server, client, 2, 100)
}

// exchange sends one sample frame from one end and checks it at the other.
func (e *transportEnv) exchange(t tb, from, to kernel.Conn, callID uint64, size int) {
	t.Helper()
	want := transportSample(nil, callID, 0, size)
	got := e.transfer(t, from, to, want)
	defer got.Release()
	if d := transportDiff(got, want); d != "" {
		t.Fatalf("frame %s→%s arrived changed: %s", from.LocalAddr(), to.LocalAddr(), d)
	}
}

// transfer writes a copy of want on from, its payload in a buffer from
// from.Buffer as the kernel does it, and returns the next frame read on to.
func (e *transportEnv) transfer(t tb, from, to kernel.Conn, want *kernel.Frame) *kernel.Frame {
	t.Helper()
	f := transportHeader(want)
	f.Payload = append(from.Buffer(len(want.Payload)), want.Payload...)
	return e.transferFrame(t, from, to, f)
}

// transferFrame writes f on from and returns the next frame read on to.
// The write runs on a goroutine of its own: a frame larger than what the
// connection buffers is written only as the peer reads it.
func (e *transportEnv) transferFrame(t tb, from, to kernel.Conn, f *kernel.Frame) *kernel.Frame {
	t.Helper()
	n := len(f.Payload)
	written := make(chan error, 1)
	transportGo(t, func() { written <- from.WriteFrame(f) })
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	read := make(chan transportReadResult, 1)
	transportGo(t, func() {
		f, err := transportRead(ctx, to)
		read <- transportReadResult{f, err}
	})
	timer := time.NewTimer(2 * e.patience)
	defer timer.Stop()
	var got *kernel.Frame
	for wrote := false; got == nil || !wrote; {
		select {
		case err := <-written:
			if err != nil {
				if got != nil {
					got.Release()
				}
				t.Fatalf("WriteFrame of a %d-byte payload: %v", n, err)
			}
			wrote = true
		case r := <-read:
			switch {
			case r.err != nil && ctx.Err() != nil:
				t.Fatalf("a frame with a %d-byte payload did not arrive within %s (ReadFrame: %v); was it lost?", n, e.patience, r.err)
			case r.err != nil:
				t.Fatalf("ReadFrame, waiting for a frame with a %d-byte payload: %v", n, r.err)
			}
			got = r.f
		case <-timer.C:
			if got != nil {
				got.Release()
				t.Fatalf("WriteFrame of a %d-byte payload did not return within %s, though its frame arrived", n, 2*e.patience)
			}
			t.Fatalf("ReadFrame ignored its context: still blocked %s after the deadline (WriteFrame returned: %t)", e.patience, wrote)
		}
	}
	return got
}

type transportReadResult struct {
	f   *kernel.Frame
	err error
}

// errReadNothing is what the suite makes of a ReadFrame that returned
// nil, nil: a report that names the defect rather than a nil Release.
var errReadNothing = errors.New("a nil frame with a nil error (ReadFrame must return a frame or an error)")

// transportRead is c.ReadFrame(ctx), every read of the suite's: the
// checks may then take a nil error for a frame.
func transportRead(ctx context.Context, c kernel.Conn) (*kernel.Frame, error) {
	f, err := c.ReadFrame(ctx)
	if f == nil && err == nil {
		err = errReadNothing
	}
	return f, err
}

// read calls c.ReadFrame(ctx) and waits for it until ctx's deadline plus
// patience; ok is false if it has not returned by then.
func (e *transportEnv) read(t tb, ctx context.Context, c kernel.Conn) (r transportReadResult, ok bool) {
	wait := e.patience
	if d, has := ctx.Deadline(); has {
		wait += time.Until(d)
	}
	return transportDo(t, wait, func() transportReadResult {
		f, err := transportRead(ctx, c)
		return transportReadResult{f, err}
	})
}

// readWithin is read for a caller with nothing else to wait for: it
// fails t if ReadFrame has not returned by ctx's deadline plus patience.
func (e *transportEnv) readWithin(t tb, ctx context.Context, c kernel.Conn) transportReadResult {
	t.Helper()
	r, ok := e.read(t, ctx, c)
	if !ok {
		t.Fatalf("ReadFrame ignored its context: still blocked %s after the deadline", e.patience)
	}
	return r
}

// recv reads the next frame from c, which must come within patience.
func (e *transportEnv) recv(t tb, c kernel.Conn) *kernel.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	r := e.readWithin(t, ctx, c)
	switch {
	case r.err != nil && ctx.Err() != nil:
		t.Fatalf("no frame arrived within %s (ReadFrame: %v); was it lost?", e.patience, r.err)
	case r.err != nil:
		t.Fatalf("ReadFrame: %v", r.err)
	}
	return r.f
}

// transportDo runs op on a goroutine of its own and waits at most d for
// it. ok is false when op has not returned by then: the call is left
// blocked (a broken plugin's; closing its connection at the end of the
// test may free it) and its result is dropped. A panic in op fails t (see
// transportGo), and op has then not returned.
func transportDo[R any](t tb, d time.Duration, op func() R) (r R, ok bool) {
	ch := make(chan R, 1)
	panicked := transportGo(t, func() { ch <- op() })
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case r = <-ch:
		return r, true
	case <-panicked:
		return r, false
	case <-timer.C:
		return r, false
	}
}

// transportGo runs f, which calls into the transport under test, on a
// goroutine of its own. A panic there would end the whole test binary
// without naming the check; transportCatch makes it fail t instead, and
// the channel returned is closed then, for whoever waits for f's result.
func transportGo(t tb, f func()) (panicked <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		returned := false
		defer func() {
			if !returned {
				close(ch)
			}
		}()
		defer transportCatch(t)
		f()
		returned = true
	}()
	return ch
}

// transportCatch, deferred on a goroutine of the suite's, fails t with a
// panic in the transport and the stack that names where. A panic in a
// call the suite gave up on may come after t has ended, when t can no
// longer fail: it is dropped then.
func transportCatch(t tb) {
	p := recover()
	if p == nil {
		return
	}
	defer func() { _ = recover() }() // t had ended
	t.Errorf("the transport panicked: %v\n%s", p, debug.Stack())
}

// transportWaitDone reports whether c's Done closes within d.
func transportWaitDone(c kernel.Conn, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c.Done():
		return true
	case <-timer.C:
		return false
	}
}
