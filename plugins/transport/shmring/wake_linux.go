package shmring

import (
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
	sleeping = 1
)

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
			// already and the peer will wake anyway; a broken socket means
			// the peer is gone, which the watching goroutine reports.
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
	if word.Load() == sleeping && word.CompareAndSwap(sleeping, awake) {
		w.raw.Write(w.send[msg])
	}
}

// wakeUp passes on a wake-up from the peer and reports whether msg is one.
func (c *conn) wakeUp(msg byte) bool {
	switch msg {
	case wakeReader:
		c.readBell.ring()
	case wakeWriters:
		c.space.open()
	default:
		return false
	}
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

// sleepOn parks until ch closes or d passes.
func sleepOn(ch <-chan struct{}, d time.Duration) {
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	select {
	case <-ch:
	case <-t.C:
	}
	t.Stop()
	timers.Put(t)
}

// yield lets another thread that waits for this core run: while one side
// polls, the peer it waits for may be queued behind it on the same core.
func yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
