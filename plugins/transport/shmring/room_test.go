//go:build linux

package shmring

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A writer that finds no room parks until something changes what it saw.
// Room is made in three ways — the reader moves its tail, the reader frees
// an entry of its held table, this side gives back space (an island let
// go, a lent buffer recycled) — and each must wake it: these tests make
// the recheck an hour long, so that only the wake-up can move the writer.

// gateChan is the channel writers waiting for room on c park on now (nil
// when none waits).
func gateChan(c *conn) chan struct{} {
	c.space.mu.Lock()
	defer c.space.mu.Unlock()
	return c.space.ch
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// The interleaving behind plugintest's Concurrent/Calls stalling: the
// server holds every request it read (its handlers answer first, then
// release), the client's writers wait for room, the server's reader lists
// the held records and moves its tail past them, yet they cover the ring,
// so the writers wait again; then the handlers release them all. Freeing
// a held entry makes room without moving the tail: unless that wakes the
// writers, they sleep until wait_timeout, and the server, with nothing
// left to read, waits for them.
func TestReleasingAListedFrameWakesAWriterWaitingForRoom(t *testing.T) {
	o := testOptions() // 64 KiB rings
	o.WaitTimeout = kernel.Duration(20 * time.Second)
	tr := newTransport(t, o)
	tr.writerRecheck = time.Hour
	client, server := connect(t, tr, listen(t, tr))
	ring := client.out.r

	// 48 requests of 1256-byte records fill 60288 bytes of the ring; the
	// server reads them all and holds them.
	const held = 48
	var frames []*kernel.Frame
	for i := range held {
		send(t, client, &kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i + 1)}, pattern(1000, byte(i)))
	}
	for range held {
		frames = append(frames, recv(t, server))
	}

	// A write that needs more room than is left waits; the server is not
	// reading, so nothing is listed yet.
	big := pattern(8000, 7)
	wrote := make(chan error, 1)
	go func() {
		wrote <- client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 100, Payload: big})
	}()
	waitWord(t, ring.writer, sleeping, "the client's writer sleep word")
	waitParked(t, "shmring.sleepOn")
	first := gateChan(client)

	// The server reads again: finding a writer waiting, it lists the 48
	// records and moves its tail past them, which wakes the writer; the
	// records still cover the ring, so it parks again, on a new gate.
	type read struct {
		f   *kernel.Frame
		err error
	}
	got := make(chan read, 1)
	ctx := timeout(t, 30*time.Second)
	go func() {
		f, err := server.ReadFrame(ctx)
		got <- read{f, err}
	}()
	waitFor(t, "the server listing the 48 records it holds", func() bool { return ring.nheld.Load() == held })
	waitFor(t, "the writer parking again after the listing woke it", func() bool {
		ch := gateChan(client)
		return ch != nil && ch != first && ring.writer.Load() == sleeping
	})
	waitParked(t, "shmring.sleepOn")
	select {
	case err := <-wrote:
		t.Fatalf("the write finished while the ring was covered with held records: %v", err)
	default:
	}

	// The handlers are done: releasing the frames frees every entry.
	for _, f := range frames {
		f.Release()
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the waiting write, once the held records were released: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a writer waiting for room slept on after the reader released the %d held records covering the ring (held count now %d): freeing a held entry must wake it", held, ring.nheld.Load())
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("server ReadFrame: %v", r.err)
		}
		if r.f.CallID != 100 || len(r.f.Payload) != len(big) {
			t.Fatalf("the server read call %d with %d bytes, want call 100 with %d", r.f.CallID, len(r.f.Payload), len(big))
		}
		r.f.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not receive the frame written once room was made")
	}
}

// A peer that frees held entries without waking the writer (a lost or
// never-sent wake-up) costs the writer one recheck: after each slice it
// tries its reservation again, whatever it watches for.
func TestAWriterFindsAFreedHeldEntryWithoutAWakeUpAtTheNextRecheck(t *testing.T) {
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

	// As the reader: list every published record as still lent out, move
	// the tail past them and wake the writer, as docs/protocol.md says.
	head := out.head.Load()
	var listed int
	for pos := uint64(0); pos < head; listed++ {
		size := uint64(ne.Uint32(out.data[pos%uint64(len(out.data)):]))
		out.held[listed][0].Store(pos)
		out.held[listed][1].Store(pos + size)
		out.nheld.Add(1)
		pos += size
	}
	out.tail.Store(head)
	if !out.writer.CompareAndSwap(sleeping, awake) {
		t.Fatal("the writer sleep word changed under the test")
	}
	peerWakeUp(t, r, wakeWriters)
	// The records still cover the ring: the writer looks and parks again.
	waitWord(t, out.writer, sleeping, "the writer sleep word, after its wake-up")
	waitParked(t, "shmring.sleepOn")
	if h := out.head.Load(); h != head {
		t.Fatalf("the writer published up to %d over %d held records ending at %d", h, listed, head)
	}

	// Free the entries, and send no wake-up.
	for i := range listed {
		out.held[i][1].Store(0)
		out.held[i][0].Store(0)
		out.nheld.Add(^uint32(0))
	}
	waitFor(t, "a writer given room by freed held entries, without a wake-up, writing within a recheck", func() bool {
		return out.head.Load() != head
	})
}

// A lent buffer recycled at the end of what is reserved gives its space
// back at once: a writer waiting for that space is woken, not left for the
// reader's next release.
func TestRecyclingALentBufferWakesAWriterWaitingForRoom(t *testing.T) {
	o := testOptions()
	o.WaitTimeout = kernel.Duration(20 * time.Second)
	tr := newTransport(t, o)
	tr.writerRecheck = time.Hour
	r := newRawConn(t, tr)
	defer r.close()
	out := r.seg.ring(serverToClient)
	// Six 8256-byte records, then a buffer lent over most of the rest.
	for i := range 6 {
		send(t, r.c, &kernel.Frame{Type: kernel.FrameResponse, CallID: uint64(i)}, pattern(8000, byte(i)))
	}
	lent := r.c.Buffer(15000)
	if _, inRing := r.c.ringOffset(lent); !inRing {
		t.Fatal("Buffer(15000) did not lend ring space with 16000 bytes free")
	}
	head := out.head.Load()
	wrote := make(chan error, 1)
	go func() {
		wrote <- r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 6, Payload: pattern(8000, 6)})
	}()
	waitWord(t, out.writer, sleeping, "the writer sleep word")
	waitParked(t, "shmring.sleepOn")
	r.c.Recycle(lent)
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the waiting write, once the lent buffer was recycled: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a writer waiting for room slept on after the lent buffer holding that room was recycled: giving space back must wake it")
	}
	if out.head.Load() == head {
		t.Fatal("the write returned without publishing")
	}
}
