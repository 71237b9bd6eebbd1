package shmring

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waking up. A side that found nothing to do polls for a while, then
// declares in a sleep word of the segment that it sleeps and parks its
// goroutine on a channel. The peer, having published records (or released
// them), sends one byte over the liveness socket only if it finds that
// declaration; the goroutine watching the socket, parked in the netpoller
// like any socket reader, passes it on. So a side waiting for its peer
// holds no OS thread, however long it waits: a futex wait held one per
// waiting connection, and ten thousand idle clients reached the runtime's
// thread limit. The socket is already there and already watched, so a
// connection costs no descriptor and no goroutine more than before.

// Sleep words: a side about to sleep stores sleeping, looks once more for
// what it waits for, then parks. The other side, having published, sends a
// wake-up only if the word says so, and swaps it back to awake first, so
// that each sleep costs one wake-up and a busy peer costs none.
const (
	awake    = 0
	sleeping = 1 // parked: woken by a byte on the socket
	napping  = 2 // in a futex wait on the word, for at most napTime
)

// A reader that starts to sleep first naps: a futex wait on its sleep
// word, which the writer ends with one FUTEX_WAKE and the kernel turns
// straight into a running thread. Most sleeps are that short, and parking
// a goroutine, to be woken through the socket and the netpoller, made a
// 16-byte round trip over shm-ring 1.4x slower (PingPong/16B, 2.6 µs
// against 3.75 µs), though fewer than one wait in a thousand slept. A nap
// holds an OS thread, so only maxNappers readers of a process nap at once
// and each for at most napTime; then the reader parks as before, holding
// no thread however long it waits.
const (
	napTime    = time.Millisecond
	maxNappers = 4
)

// Futex operations on a shared mapping (no FUTEX_PRIVATE_FLAG: the word is
// keyed by the file and offset, so the peer process wakes us).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// nappers counts the readers of this process in a futex wait.
var nappers atomic.Int32

// nap waits on word while it says napping, at most napTime, if a nap slot
// is free, and reports whether it took one.
func nap(word *atomic.Uint32) bool {
	if nappers.Add(1) > maxNappers {
		nappers.Add(-1)
		return false
	}
	ts := unix.NsecToTimespec(int64(napTime))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWaitOp, napping, uintptr(unsafe.Pointer(&ts)), 0, 0)
	nappers.Add(-1)
	return true
}

// futexWake ends the nap of the side waiting on word. Waking never blocks,
// so it skips the scheduler's bookkeeping for blocking calls.
func futexWake(word *atomic.Uint32) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakeOp, 1<<31-1, 0, 0, 0)
}

// Wake-ups, each a one-byte message on the liveness socket.
const (
	wakeReader  = 1 // the ring you read has new records, or a writer of it waits for space
	wakeWriters = 2 // the ring you write has room again
)

// wakeMsgs are the messages' bytes, where a system call can point at them.
var wakeMsgs = [3]byte{0, wakeReader, wakeWriters}

// peerWaker sends wake-ups to the peer.
type peerWaker struct {
	raw syscall.RawConn
	// send holds one prebuilt callback per message, so that a wake-up
	// allocates nothing.
	send [3]func(fd uintptr) bool
}

func newPeerWaker(sock *net.UnixConn) peerWaker {
	// SyscallConn fails only on a nil connection.
	raw, _ := sock.SyscallConn()
	w := peerWaker{raw: raw}
	for _, msg := range []byte{wakeReader, wakeWriters} {
		w.send[msg] = func(fd uintptr) bool {
			// Never waits: a full socket buffer means wake-ups are queued
			// already, and the peer wakes both its reader and its writers
			// on any of them (conn.wakeUp); a broken socket means the peer
			// is gone, which the watching goroutine reports.
			unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&wakeMsgs[msg])), 1,
				unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
			return true
		}
	}
	return w
}

// ifSleeping wakes the peer's side that sleeps on word, if it said it
// sleeps. It goes through the RawConn, not the bare descriptor, so that a
// socket closed meanwhile is never written to under a reused number.
func (w *peerWaker) ifSleeping(word *atomic.Uint32, msg byte) {
	for v := word.Load(); v != awake; v = word.Load() {
		if !word.CompareAndSwap(v, awake) {
			continue // it went from napping to sleeping meanwhile
		}
		if v == napping {
			futexWake(word)
		} else {
			w.raw.Write(w.send[msg])
		}
		return
	}
}

// wakeUp passes on a wake-up from the peer and reports whether msg is one.
// Either kind wakes the reader and the writers alike: the peer drops a
// wake-up that finds the socket's buffer full, counting on those queued
// to wake this side, and a queue of wake-writers bytes must then wake a
// reader too (and the other way round), or it sleeps with a frame
// waiting. A needless wake-up costs one more look at the ring.
func (c *conn) wakeUp(msg byte) bool {
	if msg != wakeReader && msg != wakeWriters {
		return false
	}
	c.readBell.ring()
	c.space.open()
	return true
}

// bell wakes the one goroutine that reads (conn.readMu). It is cleared
// before the sleep word is set, so a ring after that is for this sleep;
// a stale one costs one more look at the ring.
type bell chan struct{}

func (b bell) ring() {
	select {
	case b <- struct{}{}:
	default:
	}
}

func (b bell) clear() {
	select {
	case <-b:
	default:
	}
}

// gate wakes every writer waiting for space at once: each takes the
// current channel before its last look at the ring, and open closes it.
// A channel is made only when a writer waits, never per frame.
type gate struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *gate) wait() <-chan struct{} {
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	ch := g.ch
	g.mu.Unlock()
	return ch
}

func (g *gate) open() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}

// timers are reused by waiting writers, so that a full ring does not
// allocate a timer per wait.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// sleepOn parks until ch closes or d passes, and reports whether ch closed.
func sleepOn(ch <-chan struct{}, d time.Duration) (woken bool) {
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	select {
	case <-ch:
		woken = true
	case <-t.C:
	}
	t.Stop()
	timers.Put(t)
	return woken
}

// spaceSeen is what a writer that found no room saw, under the
// producer's lock: anything that can make room since changes one of
// these, and whoever changes it wakes the writers after.
type spaceSeen struct {
	tail  uint64 // the reader's tail: moved by the reader (wake writers)
	held  uint32 // the reader's held count: an entry freed by the reader (wake writers)
	epoch uint64 // this side's space given back: an island let go, a buffer recycled (space.open)
}

// sawSpace is what the writer saw when its reservation failed; p.mu is held.
func (p *producer) sawSpace() spaceSeen {
	return spaceSeen{tail: p.tail, held: p.heldSeen, epoch: p.freed.Load()}
}

// waitSpace waits until what seen describes changed (room may have been
// made), the connection died, a wake-up came, deadline passed, or one
// recheck went by, so that the caller tries its reservation again: polling
// first if spin says so, then parked, its sleep declared in the writer
// sleep word.
func (c *conn) waitSpace(deadline time.Time, seen spaceSeen, spin bool) {
	p := &c.out
	progress := func() bool {
		return p.r.tail.Load() != seen.tail || p.r.nheld.Load() != seen.held || p.freed.Load() != seen.epoch ||
			c.Err() != nil || c.peerGone.Load()
	}
	if spin && poll(c.t.spin, time.Now(), progress) {
		return
	}
	// Several writers may sleep on the word: none clears it on waking, or
	// it could clear another's declaration. The reader clears it when it
	// wakes them all; a stale one costs the reader one needless wake-up.
	woken := c.space.wait()
	p.r.writer.Store(sleeping)
	d := time.Until(deadline)
	if d <= 0 || progress() {
		return
	}
	// A reader asleep may hold frames it could list: wake it to do so.
	c.wake.ifSleeping(p.r.reader, wakeReader)
	// One slice of c.t.writerRecheck at most: a wake-up lost (a peer that
	// does not send it) then costs a slice, not the whole wait_timeout,
	// and only a writer facing a full ring pays for the slices.
	sleepOn(woken, min(d, c.t.writerRecheck))
}

// writerRecheck is how long a writer waiting for room parks before it
// looks at the ring again (transport.writerRecheck; tests lengthen it).
const writerRecheck = 10 * time.Millisecond

// waitData waits for the writer to publish, the connection to die or ctx
// to end: polling while the peer usually answers within the spin budget,
// then parked, its sleep declared in the reader sleep word, which the
// writer wakes only after seeing it set.
func (c *conn) waitData(ctx context.Context) error {
	in := &c.in
	arrived := func() bool {
		return in.r.head.Load() != in.rd || c.peerGone.Load() || c.death.Load() != nil
	}
	start := time.Now()
	if poll(c.readWait.budget(c.t.spin), start, arrived) {
		c.readWait.observe(time.Since(start))
		return nil
	}
	c.readBell.clear()
	w := in.r.reader
	w.Store(napping)
	// A writer waiting for space while this side holds frames: list them,
	// so that the writer can skip them (it woke us, if we slept, to do so).
	if in.r.writer.Load() == sleeping && in.islandize() {
		wakeSelf(w)
		return nil
	}
	// Nap first (ctx is looked at after it, at most napTime late); a
	// writer that saw napping swapped the word to awake and woke us, so
	// only a word still napping goes on to park.
	if !arrived() && ctx.Err() == nil && (!nap(w) || w.Load() == napping) && w.CompareAndSwap(napping, sleeping) && !arrived() {
		select {
		case <-c.readBell:
		case <-ctx.Done():
		}
	}
	wakeSelf(w)
	if err := ctx.Err(); err != nil {
		// Ended by the reader, not the peer: the engine's idle reader is
		// cancelled by the next call, and its long wait must not cut that
		// call's polling short.
		return err
	}
	c.readWait.observe(time.Since(start))
	return nil
}

// wakeSelf clears this side's own sleep word, however it slept.
func wakeSelf(w *atomic.Uint32) {
	if v := w.Load(); v != awake {
		w.CompareAndSwap(v, awake)
	}
}

// waitStats keeps a moving average of how long the reader waited for data.
// While waits are short the reader polls for the whole spin budget; once
// they are much longer (an idle connection, a slow peer) it polls only
// briefly, so that waiting does not burn a core. The average counts the
// time to wake up from a sleep too, which a busy machine makes long: the
// bar is set well above the budget, so that a few slow wake-ups do not
// stop the polling that avoids them.
// Only the reader, under readMu, uses it.
type waitStats struct{ avg time.Duration }

// idleWaits is how many spin budgets the average wait must exceed for the
// reader to poll only briefly.
const idleWaits = 16

func (w *waitStats) budget(spin time.Duration) time.Duration {
	if w.avg > idleWaits*spin {
		return spin / 8
	}
	return spin
}

func (w *waitStats) observe(d time.Duration) { w.avg += (d - w.avg) / 8 }
