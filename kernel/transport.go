package kernel

import (
	"context"
	"errors"
	"time"
)

// Transport moves frames between a client and a server. It listens and
// dials by address; a Conn carries frames both ways with many calls in
// flight at once, matched by Frame.CallID.
//
// A transport is built by its Factory from its options. Listeners and
// connections it made are the caller's to close; a transport that holds
// resources of its own also implements io.Closer.
type Transport interface {
	// Listen starts accepting connections on addr. The address syntax is the
	// transport's own (host:port for tcp-lv, a socket path for shm-ring).
	Listen(ctx context.Context, addr string) (Listener, error)
	// Dial connects to a listener at addr. It returns once ctx is done,
	// by its deadline or its cancellation: the engine dials on the
	// goroutine of a caller, which must not be held past its context.
	Dial(ctx context.Context, addr string) (Conn, error)
}

// Listener accepts connections until it is closed.
type Listener interface {
	// Accept waits for the next connection. After Close it returns an error
	// wrapping ErrClosed.
	Accept(ctx context.Context) (Conn, error)
	// Addr is the address clients dial, with any port the system chose.
	Addr() string
	// Close stops accepting; connections already accepted stay open.
	Close() error
}

// Conn is one connection. Many goroutines may call WriteFrame at once; one
// goroutine at a time may call ReadFrame (the engine hands the reading role
// from caller to caller, so a lone caller reads its own reply without a
// goroutine hand-off).
type Conn interface {
	// Buffer returns an empty buffer with capacity for at least sizeHint
	// bytes, into which the caller appends (encodes) an outgoing payload.
	// The memory may be the transport's own (a ring slot, a pooled buffer):
	// the buffer, or the slice the append produced from it, must be passed
	// to WriteFrame as Payload or given back with Recycle. When the append
	// outgrew the buffer (it moved to a new array), the buffer itself must
	// be given back with Recycle too: a transport lending ring space cannot
	// tell that it was abandoned.
	Buffer(sizeHint int) []byte
	// Recycle gives back a buffer from Buffer that will not be sent.
	Recycle(buf []byte)
	// WriteFrame sends f. It does not keep f after it returns, but it owns
	// f.Payload from then on (it gives it back to its pool once written).
	// It never waits for another caller's write to finish: when the
	// connection is busy writing, f is queued and written in a batch.
	// A Request may also be held while whole frames already received
	// wait for ReadFrame (the engine's readers take them promptly), so
	// that the requests a burst of answers prompts share a write; it must
	// leave as soon as none waits.
	// An error that is a *Status (e.g. ResourceExhausted from a full ring)
	// means this frame alone was refused and nothing of it was sent: the
	// connection stays usable, and the engine fails only that call. Any
	// other error means the connection is dead and f did not reach the
	// peer whole: the engine sends the call again elsewhere.
	WriteFrame(f *Frame) error
	// ReadFrame returns the next frame from the peer. Its payload is lent
	// until the frame's Release. When ctx is done first, ReadFrame returns
	// ctx's error and the connection stays usable: the next ReadFrame
	// resumes where this one stopped. Transport-level frames (Ping, Pong)
	// are answered inside the transport and never returned.
	ReadFrame(ctx context.Context) (*Frame, error)
	// Close closes the connection; pending and later operations fail with
	// an error wrapping ErrClosed. Close is idempotent.
	Close() error
	// Done is closed when the connection is dead, by Close or by failure.
	Done() <-chan struct{}
	// Err says why the connection died; nil while it is alive.
	Err() error
	// LocalAddr and RemoteAddr describe the two ends, for logs and filters.
	LocalAddr() string
	RemoteAddr() string
}

// ErrClosed is wrapped by errors from operations on a closed listener or
// connection.
var ErrClosed = errors.New("closed")

// ErrPeerGone is wrapped when a connection died because the peer vanished:
// keepalive timed out, the socket reset, or the peer's process exited.
// Calls pending on such a connection fail with status Unavailable.
var ErrPeerGone = errors.New("peer gone")

// TransportCapabilities is an optional interface: a transport declares what it can do
// beyond the Transport contract, so that the engine and plugintest can take
// the fast path or skip a check with a reason.
type TransportCapabilities interface {
	// LendsMemory reports whether Buffer and ReadFrame payloads are memory
	// the transport owns and will reuse after Recycle/WriteFrame/Release.
	LendsMemory() bool
}

// HalfCloser is an optional Conn interface: CloseWrite sends every frame
// already queued, then tells the peer that no more frames will come (a TCP
// FIN), while frames from the peer can still be read. A draining server
// uses it so that a request racing its close is read and left unserved
// (the client, having the GoAway, resends it safely) instead of being
// reset away together with the answers before it.
type HalfCloser interface {
	CloseWrite() error
}

// BufferedReader is an optional Conn interface: Buffered reports how many
// received bytes ReadFrame can consume without waiting. It is called only
// by the goroutine that holds the reading role. The server uses it to serve
// a lone request inline (no goroutine hand-off) and to start a parallel
// reader when more requests are already waiting.
type BufferedReader interface {
	Buffered() int
}

// FrameQueuer is an optional Conn interface: QueueFrame is WriteFrame that
// never writes on the caller's goroutine but adds f to the batch the
// connection's writer sends next. A server answering a burst of requests
// from one connection uses it, so that the answers share a syscall.
type FrameQueuer interface {
	QueueFrame(f *Frame) error
}

// ContextWriter is an optional Conn interface, for a transport whose
// WriteFrame may wait on the peer (shm-ring waits for room in its ring,
// up to wait_timeout; tcp-lv for the peer to drain its socket, up to
// write_timeout): WriteFrameContext is WriteFrame that also stops waiting
// when ctx is done, in one of two ways. Either f is refused alone, as by
// a full ring: the error is a *Status with ctx's code (DeadlineExceeded
// or Canceled), nothing of f is delivered, and the connection stays
// usable. Or, for a transport that cannot take back a frame it has begun
// to send, f is handed on: the error is nil, and the connection delivers
// f whole, before any frame written after it, or fails as it would have
// failed the write. A frame that needs no wait is written whatever ctx.
// The engine writes a call's request, and a stream's messages where the
// connection does not queue them (FrameQueuer), with the call's context,
// so that a deadline bounds the wait as it bounds the rest of the call.
type ContextWriter interface {
	WriteFrameContext(ctx context.Context, f *Frame) error
}

// DeadlineOnly reports the deadline of a context the engine passes to
// ReadFrame when nothing but that deadline can end the context while a read
// matters: the engine's own call contexts for a deadline it gave (from
// client.timeout or a Deadliner) to a call whose caller's context cannot
// be canceled. (Such a context also ends when its call is over, but the
// call is then done waiting: a read that goes on serves the connection's
// other calls.) A transport may then wait with a socket read deadline,
// which costs no allocation, instead of context.AfterFunc on ctx. Such a
// context's Err reads the clock: it is DeadlineExceeded as soon as the
// deadline has passed, so a read the socket deadline ended can tell. Any
// other context reports false.
func DeadlineOnly(ctx context.Context) (time.Time, bool) {
	if d, ok := ctx.(deadlineOnly); ok {
		return d.DeadlineOnly()
	}
	return time.Time{}, false
}

// deadlineOnly is implemented by the engine's call contexts.
type deadlineOnly interface {
	DeadlineOnly() (time.Time, bool)
}
