package kernrpc

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/internal/bufpool"
	"github.com/kernrpc/kernrpc/kernel"
)

// Flow control for streams (docs/protocol.md, "Flow control"): a sender
// spends credit on every message it sends, on the stream and on the
// connection, and the receiver grants it back as its application reads.
// A side may send a message when what it sent and has not had granted
// back, plus the message, fits the receiver's window, or when what it has
// outstanding is at most half the window (so that a message larger than
// the window still goes). The receiver grants credit back once more than
// half the window has been read, so a sender that waits always gets some.
// A receiver therefore holds at most max(window, window/2 + one message)
// per stream and per connection.

// sendWindow is the credit a sender has left on a stream or a connection.
// Taking credit that is there costs a compare-and-swap: a stream of small
// messages takes it twice a message. The mutex orders waiting against
// credit coming back.
type sendWindow struct {
	known  atomic.Bool  // the receiver announced its window
	window int64        // the receiver's window, as announced; set before known
	used   atomic.Int64 // sent, and not granted back yet

	mu sync.Mutex
	// wake is closed, and replaced, whenever credit comes back or the
	// window becomes known: every sender waiting on it looks again.
	wake chan struct{}
}

func (w *sendWindow) wakeLocked() {
	if w.wake != nil {
		close(w.wake)
		w.wake = nil
	}
}

// announce records the receiver's window (its first grant), or, once
// known, grants n more.
func (w *sendWindow) announce(n int64) {
	w.mu.Lock()
	if !w.known.Load() {
		w.window = n
		w.known.Store(true)
	} else {
		w.used.Add(-n)
	}
	w.wakeLocked()
	w.mu.Unlock()
}

// wakeAll wakes every sender waiting on w, to look at why it should stop.
func (w *sendWindow) wakeAll() {
	w.mu.Lock()
	w.wakeLocked()
	w.mu.Unlock()
}

// take spends cost if the window allows it, else returns a channel closed
// when it may, and takes nothing.
func (w *sendWindow) take(cost int64) (ok bool, wait <-chan struct{}) {
	if w.tryTake(cost) {
		return true, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{})
	}
	// Looked at again with the channel in place: credit that comes back
	// either shows here or closes the channel, since announce and refund
	// give it back before they close the channel under the lock.
	if w.tryTake(cost) {
		return true, nil
	}
	return false, w.wake
}

// tryTake spends cost if the window is known and allows it.
func (w *sendWindow) tryTake(cost int64) bool {
	if !w.known.Load() {
		return false
	}
	for {
		used := w.used.Load()
		if used > w.window/2 && used+cost > w.window {
			return false
		}
		if w.used.CompareAndSwap(used, used+cost) {
			return true
		}
	}
}

// refund gives back credit taken for a message that was not sent.
func (w *sendWindow) refund(cost int64) {
	w.used.Add(-cost)
	w.mu.Lock()
	w.wakeLocked()
	w.mu.Unlock()
}

// recvWindow is what a receiver granted and what its application has read
// since it last granted credit back. The owner guards it.
type recvWindow struct {
	window      int64 // as announced to the sender
	outstanding int64 // received and not granted back
	unread      int64 // read (or dropped) since the last grant
}

// accept counts a received message of cost, reporting false if the sender
// had no credit for it: a broken rule.
func (w *recvWindow) accept(cost int64) bool {
	if w.outstanding > w.window/2 && w.outstanding+cost > w.window {
		return false
	}
	w.outstanding += cost
	return true
}

// consumed notes that cost was read and returns the credit to grant back
// now, once more than half the window has been read: a grant per message
// would cost a frame per message. A sender waiting for credit has more
// than half the window outstanding, so reading it all always grants.
func (w *recvWindow) consumed(cost int64) (grant int64) {
	w.unread += cost
	if w.unread <= w.window/2 {
		return 0
	}
	grant = w.unread
	w.unread, w.outstanding = 0, w.outstanding-grant
	return grant
}

// connFlow is one connection's flow control across its streams: the
// credit the peer's connection window leaves us, and our own window.
type connFlow struct {
	send sendWindow

	mu   sync.Mutex
	recv recvWindow
	// announceMu orders our connection window's announcement before every
	// stream frame we send; announced is set once it is out.
	announceMu sync.Mutex
	announced  bool
	// held counts received payloads the streams keep in transport memory
	// (lent) rather than in copies: a few save a copy each, many would
	// hold a ring-buffer transport's space.
	held int32
	// copies are the buffers received payloads are copied into once held
	// is at its bound, taken back after decoding.
	copies *bufpool.Pool
	// refused is told of a WindowUpdate the transport refused alone (a
	// *kernel.Status: shm-ring found no room in its ring for wait_timeout)
	// on a connection that lives on; the side closes the connection (see
	// writeGrant). Set once, before the first grant.
	refused func(id uint64, err error)
}

// maxHeldPerConn bounds the payloads a connection's streams keep lent.
const maxHeldPerConn = 16

func newConnFlow(window int64) *connFlow {
	return &connFlow{recv: recvWindow{window: window}, copies: bufpool.New(bufpool.Limits{
		MaxSize: 1 << 20, ClassBudget: 4 << 20, MinPerClass: 4, MaxPerClass: 256})}
}

// announce sends our connection window once, before the caller's first
// stream frame.
func (fl *connFlow) announce(write func(*kernel.Frame) error) error {
	fl.announceMu.Lock()
	defer fl.announceMu.Unlock()
	if fl.announced {
		return nil
	}
	if err := write(&kernel.Frame{Type: kernel.FrameWindowUpdate, Credit: uint32(fl.recv.window)}); err != nil {
		return err
	}
	fl.announced = true
	return nil
}

// wasAnnounced reports whether our connection window went out: before it,
// the peer has no credit to send stream data with.
func (fl *connFlow) wasAnnounced() bool {
	fl.announceMu.Lock()
	defer fl.announceMu.Unlock()
	return fl.announced
}

// accept counts a message received on any stream of the connection.
func (fl *connFlow) accept(cost int64) bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.recv.accept(cost)
}

// consumed notes a message read or dropped and grants the connection's
// credit back when due.
func (fl *connFlow) consumed(cost int64, write func(*kernel.Frame) error) {
	fl.mu.Lock()
	grant := fl.recv.consumed(cost)
	fl.mu.Unlock()
	fl.writeGrant(write, 0, grant)
}

// maxGrant is the most one WindowUpdate grants: credit goes below 2³¹.
const maxGrant = 1<<31 - 1

// writeGrant sends n of credit on stream id (0: the connection), in as
// many WindowUpdates as it takes: what is due can pass maxGrant when a
// message larger than the window was read.
//
// Credit whose WindowUpdate fails is not sent again. On a dead connection
// that does not matter. One the transport refused alone (the connection
// lives on) leaves the peer short of that credit for good: counted as
// granted here, it never reaches the sender, whose stream (or, on the
// connection, every stream) may wait for it until its context ends, and
// nothing would prompt a second try, since the sender sends nothing while
// it waits. So the side is told (refused), and closes the connection: its
// calls and streams end at once, Unavailable on the client, instead of
// hanging.
func (fl *connFlow) writeGrant(write func(*kernel.Frame) error, id uint64, n int64) {
	for n > 0 {
		c := min(n, maxGrant)
		if err := write(&kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: id, Credit: uint32(c)}); err != nil {
			fl.grantFailed(id, err)
			return
		}
		n -= c
	}
}

// grantFailed handles a WindowUpdate (a grant, or a window announced)
// that could not be written: refused alone, it tells the side.
func (fl *connFlow) grantFailed(id uint64, err error) {
	var st *kernel.Status
	if fl.refused != nil && errors.As(err, &st) {
		fl.refused(id, err)
	}
}
