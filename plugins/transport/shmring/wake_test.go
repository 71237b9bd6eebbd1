//go:build linux

package shmring

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kernrpc/kernrpc/kernel"
)

// These tests play the peer by hand, as docs/protocol.md describes it:
// they write records and sleep words into the segment and wake-ups onto
// the socket themselves.

// peerWakeUp sends msg from the peer's end of the socket.
func peerWakeUp(t *testing.T, r *rawConn, msg byte) {
	t.Helper()
	if _, err := r.peer.Write([]byte{msg}); err != nil {
		t.Fatalf("peer: sending wake-up %d: %v", msg, err)
	}
}

// peerReceived returns what the connection sent the peer on the socket
// so far, without waiting.
func peerReceived(t *testing.T, r *rawConn) []byte {
	t.Helper()
	var got []byte
	b := make([]byte, 16)
	for {
		n, _, err := unix.Recvfrom(int(r.peer.Fd()), b, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return got
		}
		if err != nil {
			t.Fatalf("peer: reading the socket: %v", err)
		}
		got = append(got, b[:n]...)
	}
}

func waitWord(t *testing.T, word interface{ Load() uint32 }, want uint32, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for word.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s never became %d", what, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitParked waits until a goroutine is parked in a select inside fn:
// past its last look at the ring, so that what the test publishes next
// can only reach it through a wake-up.
func waitParked(t *testing.T, fn string) {
	t.Helper()
	waitGoroutine(t, "[select", fn)
}

// waitGoroutine waits until a goroutine whose state starts with state
// ("[select", "[sync.Mutex.Lock") has fn on its stack.
func waitGoroutine(t *testing.T, state, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, state) && strings.Contains(g, fn) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine in state %s in %s", state, fn)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestASleepingReaderWakesOnlyOnTheWakeUpByte(t *testing.T) {
	r := newRawConn(t, newTransport(t, testOptions()))
	defer r.close()
	in := r.seg.ring(clientToServer)
	got := make(chan *kernel.Frame, 1)
	go func() {
		f, err := r.c.ReadFrame(timeout(t, 20*time.Second))
		if err != nil {
			t.Errorf("ReadFrame: %v", err)
		}
		got <- f
	}()
	waitWord(t, in.reader, sleeping, "the reader sleep word")
	waitParked(t, "shmring.(*conn).waitData")
	// Published, but the reader declared that it sleeps and the peer has
	// not woken it: a parked reader does not look.
	rec := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 3, Payload: []byte("hi")}))
	copy(in.data, rec)
	in.head.Store(uint64(len(rec)))
	select {
	case <-got:
		t.Fatal("a reader that declared it sleeps read on without a wake-up: it polls instead of parking")
	case <-time.After(50 * time.Millisecond):
	}
	in.reader.CompareAndSwap(sleeping, awake)
	peerWakeUp(t, r, wakeReader)
	select {
	case f := <-got:
		if f == nil || f.CallID != 3 || string(f.Payload) != "hi" {
			t.Fatalf("woken reader read %+v", f)
		}
		f.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the wake-up byte did not wake the reader")
	}
}

func TestAWriterSendsAWakeUpOnlyToAPeerThatSleeps(t *testing.T) {
	r := newRawConn(t, newTransport(t, testOptions()))
	defer r.close()
	out := r.seg.ring(serverToClient)
	write := func(id uint64) {
		t.Helper()
		send(t, r.c, &kernel.Frame{Type: kernel.FrameResponse, CallID: id}, []byte("answer"))
	}
	write(1)
	if b := peerReceived(t, r); len(b) != 0 {
		t.Fatalf("peer awake: got %v on the socket, want nothing (no system call per frame)", b)
	}
	out.reader.Store(sleeping)
	write(2)
	if b := peerReceived(t, r); len(b) != 1 || b[0] != wakeReader {
		t.Fatalf("peer asleep: got %v on the socket, want one wake-reader byte", b)
	}
	if w := out.reader.Load(); w != awake {
		t.Fatalf("the peer's reader word is %d after its wake-up, want it swapped back to %d", w, awake)
	}
	write(3)
	if b := peerReceived(t, r); len(b) != 0 {
		t.Fatalf("after one wake-up: got %v, want nothing until the peer sleeps again", b)
	}

	// The reader's side: releasing records wakes the peer's writers if
	// they said they wait.
	in := r.seg.ring(clientToServer)
	in.writer.Store(sleeping)
	rec := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 4}))
	copy(in.data, rec)
	in.head.Store(uint64(len(rec)))
	recv(t, r.c).Release()
	if b := peerReceived(t, r); len(b) != 1 || b[0] != wakeWriters {
		t.Fatalf("released a record while the peer's writers wait: got %v on the socket, want one wake-writers byte", b)
	}
}

func TestAWriterWaitingForRoomWakesOnTheWakeUpByte(t *testing.T) {
	o := testOptions()
	o.WaitTimeout = kernel.Duration(20 * time.Second)
	tr := newTransport(t, o)
	tr.writerRecheck = time.Hour // only the wake-up may move it
	r := newRawConn(t, tr)
	defer r.close()
	out := r.seg.ring(serverToClient)
	payload := pattern(8000, 1)
	var written atomic.Int64
	freed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		// The peer reads nothing: the ring fills and a write waits.
		for i := uint64(0); ; i++ {
			err := r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: i, Payload: append(r.c.Buffer(len(payload)), payload...)})
			written.Add(1)
			select {
			case <-freed:
				done <- err
				return
			default:
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	waitWord(t, out.writer, sleeping, "the writer sleep word")
	waitParked(t, "shmring.sleepOn")
	// Room, but no wake-up: the parked writer does not look.
	before := written.Load()
	out.tail.Store(out.head.Load())
	time.Sleep(50 * time.Millisecond)
	if n := written.Load(); n != before {
		t.Fatalf("a writer that declared it waits wrote %d more frames without a wake-up: it polls instead of parking", n-before)
	}
	close(freed)
	out.writer.CompareAndSwap(sleeping, awake)
	peerWakeUp(t, r, wakeWriters)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("woken writer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wake-up byte did not wake the writer")
	}
}

func TestOnlyWakeUpsMayArriveOnTheSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"unknown byte", []byte{9}},
		{"zero byte", []byte{0}},
		{"two bytes", []byte{wakeReader, wakeReader}},
		{"a long message", []byte("hello, server")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRawConn(t, newTransport(t, testOptions()))
			defer r.close()
			peerWakeUp(t, r, wakeReader)
			peerWakeUp(t, r, wakeWriters)
			if _, err := r.peer.Write(tc.msg); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.c.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("the connection lives on after %q on its socket", tc.msg)
			}
			if err := r.c.Err(); !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("after %q on the socket: %v, want an error wrapping ErrMalformedFrame", tc.msg, err)
			}
			if _, err := r.c.ReadFrame(context.Background()); !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("ReadFrame after %q on the socket: %v", tc.msg, err)
			}
		})
	}
}

// A wake-up that never comes (lost, or never sent) costs a writer waiting
// for room one recheck, not its whole wait_timeout.
func TestAWriterFindsRoomWithoutAWakeUpAtTheNextRecheck(t *testing.T) {
	o := testOptions()
	o.WaitTimeout = kernel.Duration(20 * time.Second)
	r := newRawConn(t, newTransport(t, o))
	defer r.close()
	out := r.seg.ring(serverToClient)
	payload := pattern(8000, 1)
	go func() {
		// More than the ring holds: the peer reads nothing, so a write
		// waits; the test closes the connection to end the rest.
		for i := uint64(0); i < 64; i++ {
			if r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: i, Payload: append(r.c.Buffer(len(payload)), payload...)}) != nil {
				return
			}
		}
	}()
	waitWord(t, out.writer, sleeping, "the writer sleep word")
	waitParked(t, "shmring.sleepOn")
	head := out.head.Load()
	out.tail.Store(head) // room, and no wake-up
	deadline := time.Now().Add(5 * time.Second)
	for out.head.Load() == head {
		if time.Now().After(deadline) {
			t.Fatal("a writer given room without a wake-up did not find it within 5s; it must look again every writerRecheck")
		}
		time.Sleep(time.Millisecond)
	}
}

// A reader about to sleep naps first, in a futex wait on its word: a
// writer that finds it napping ends the nap with a FUTEX_WAKE and sends
// nothing on the socket; a nap the writer does not end parks the reader
// within napTime.
func TestANappingReaderIsWokenByFutexNotTheSocket(t *testing.T) {
	r := newRawConn(t, newTransport(t, testOptions()))
	defer r.close()
	out := r.seg.ring(serverToClient)
	out.reader.Store(napping)
	send(t, r.c, &kernel.Frame{Type: kernel.FrameResponse, CallID: 1}, []byte("answer"))
	if b := peerReceived(t, r); len(b) != 0 {
		t.Fatalf("peer napping: got %v on the socket, want nothing (a futex wake-up)", b)
	}
	if w := out.reader.Load(); w != awake {
		t.Fatalf("the napping peer's word is %d after the frame, want it swapped to %d", w, awake)
	}

	// This side's reader: it naps, then parks, saying so in its word.
	in := r.seg.ring(clientToServer)
	got := make(chan *kernel.Frame, 1)
	go func() {
		f, _ := r.c.ReadFrame(timeout(t, 20*time.Second))
		got <- f
	}()
	waitWord(t, in.reader, sleeping, "the reader sleep word after its nap")
	waitParked(t, "shmring.(*conn).waitData")
	rec := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2}))
	copy(in.data, rec)
	in.head.Store(uint64(len(rec)))
	in.reader.CompareAndSwap(sleeping, awake)
	peerWakeUp(t, r, wakeReader)
	select {
	case f := <-got:
		if f == nil || f.CallID != 2 {
			t.Fatalf("woken reader read %+v", f)
		}
		f.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the wake-up byte did not wake the reader parked after its nap")
	}
}

// A sender drops a wake-up when the socket's buffer is full, trusting the
// wake-ups queued already to wake the peer. They must: a queue full of
// wake-writers bytes (its writers slept many times while its watcher was
// held up) has to wake a reader whose own wake-up found no room, or it
// sleeps until its context ends although a frame waits for it.
func TestAWakeUpDroppedOnAFullSocketIsNotLost(t *testing.T) {
	c, s := connPair(t, testOptions())
	// Hold up the server's watcher on the first wake-up it passes on, as
	// a busy process that does not schedule it would.
	s.space.mu.Lock()
	unblocked := false
	unblock := func() {
		if !unblocked {
			unblocked = true
			s.space.mu.Unlock()
		}
	}
	defer unblock()
	raw, err := c.sock.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	sendWakeWriters := func(untilFull bool) {
		t.Helper()
		var serr error
		raw.Write(func(fd uintptr) bool {
			for {
				serr = unix.Sendto(int(fd), []byte{wakeWriters}, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, nil)
				if !untilFull || serr != nil {
					return true
				}
			}
		})
		if untilFull && !errors.Is(serr, unix.EAGAIN) {
			t.Fatalf("filling the socket: %v, want EAGAIN", serr)
		} else if !untilFull && serr != nil {
			t.Fatalf("sending a wake-up: %v", serr)
		}
	}
	sendWakeWriters(false)
	waitGoroutine(t, "[sync.Mutex.Lock", "shmring.(*gate).open")
	sendWakeWriters(true) // the socket's buffer is full of wake-writers bytes

	got := make(chan *kernel.Frame, 1)
	go func() {
		f, err := s.ReadFrame(timeout(t, 20*time.Second))
		if err != nil {
			t.Errorf("ReadFrame: %v", err)
		}
		got <- f
	}()
	waitWord(t, c.out.r.reader, sleeping, "the server's reader sleep word")
	waitParked(t, "shmring.(*conn).waitData")
	// The client publishes and finds the reader asleep; its wake-up finds
	// the socket full and is dropped.
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 7}, []byte("wake up"))
	if w := c.out.r.reader.Load(); w != awake {
		t.Fatalf("the reader word is %d after the frame, want the writer to have swapped it to %d", w, awake)
	}
	unblock()
	select {
	case f := <-got:
		if f == nil || f.CallID != 7 {
			t.Fatalf("reader read %+v", f)
		}
		f.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the reader slept on with a frame published: the wake-up dropped on a full socket was lost, and the queued wake-ups did not wake it")
	}
}
