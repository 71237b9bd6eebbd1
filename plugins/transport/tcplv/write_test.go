package tcplv

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kernrpc/kernrpc/kernel"
)

// The write queue: frames queued while the socket is busy, or held while
// answers wait unread, leave together and in order.

func TestQueuedFramesLeaveTogetherInOrderWithoutAFlushCall(t *testing.T) {
	client, server := connPair(t, testOptions())
	const n = 32
	for i := range n {
		f := &kernel.Frame{Type: kernel.FrameResponse, CallID: uint64(i + 1), Payload: pattern(16+i, byte(i))}
		if err := server.QueueFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx := timeout(t, 5*time.Second)
	for i := range n {
		f, err := client.ReadFrame(ctx)
		if err != nil {
			t.Fatalf("frame %d of %d queued never arrived: %v", i+1, n, err)
		}
		if f.CallID != uint64(i+1) || !bytes.Equal(f.Payload, pattern(16+i, byte(i))) {
			t.Fatalf("frame %d: got call %d with %d bytes", i+1, f.CallID, len(f.Payload))
		}
		f.Release()
	}
	server.wmu.Lock()
	writes, frames := server.writes, server.framesOut
	server.wmu.Unlock()
	if frames != n || writes >= frames {
		t.Errorf("%d queued frames took %d writes; queueing should batch them", frames, writes)
	}
}

// The writer goroutine leaves a queue whose lock is held, counting on the
// holder to wake it once it lets go. A frame queued under cork does not
// wake it otherwise: after such a miss it must, or the frames queued
// before it would wait for the cork to end.
func TestWriterThatFoundTheQueueLockedIsWokenByTheCorkedFrameHolding(t *testing.T) {
	client, server := connPair(t, testOptions())
	server.qmu.Lock()
	server.signalWriter() // as a sender did for a frame queued just before
	for !server.missedQueue.Load() {
		time.Sleep(time.Millisecond)
	}
	own, _ := server.appendLocked(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}, nil)
	server.qmu.Unlock()
	server.pool.Put(own)
	server.corked.Store(true)
	if queued, err := server.enqueueCorked(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2}); !queued || err != nil {
		t.Fatalf("enqueueCorked = %v, %v; want it queued under the cork", queued, err)
	}
	ctx := timeout(t, 5*time.Second)
	for id := uint64(1); id <= 2; id++ {
		f, err := client.ReadFrame(ctx)
		if err != nil {
			t.Fatalf("frame %d never arrived: %v", id, err)
		}
		if f.CallID != id {
			t.Fatalf("got call %d, want %d", f.CallID, id)
		}
		f.Release()
	}
}

// A client's reader hands out a burst of answers already received; the
// requests their callers send meanwhile must wait and then leave together
// once the last answer is taken, and a Cancel must not wait for that.
func TestRequestsWrittenDuringABurstLeaveInOneWriteWhenItIsRead(t *testing.T) {
	client, server := connPair(t, testOptions())
	ctx := timeout(t, 5*time.Second)
	// sendAnswers makes the server send answers for ids in one write, and
	// reads the first of them, so that the rest wait in the client's buffer.
	sendAnswers := func(ids ...uint64) {
		t.Helper()
		server.wmu.Lock() // the writer goroutine sends them all at once
		for _, id := range ids {
			if err := server.QueueFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: id}); err != nil {
				t.Fatal(err)
			}
		}
		server.wmu.Unlock()
		readAnswer(t, ctx, client, ids[0])
		want := 0
		for _, id := range ids[1:] {
			want += kernel.FrameHeaderLen(&kernel.Frame{Type: kernel.FrameResponse, CallID: id})
		}
		if n := client.Buffered(); n != want {
			t.Fatalf("%d bytes of %d answers buffered after the first, want %d: they did not arrive together", n, len(ids)-1, want)
		}
	}
	writes := func() uint64 {
		client.wmu.Lock()
		defer client.wmu.Unlock()
		return client.writes
	}

	const burst = 8
	ids := make([]uint64, burst)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	sendAnswers(ids...)
	before := writes()
	for i := 1; i < burst-1; i++ {
		readAnswer(t, ctx, client, ids[i])
		if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(100 + i), Payload: []byte("next")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := writes() - before; n != 0 {
		t.Fatalf("%d writes while answers waited unread; the requests should wait for them", n)
	}
	readAnswer(t, ctx, client, ids[burst-1])
	for i := 1; i < burst-1; i++ {
		f, err := server.ReadFrame(ctx)
		if err != nil || f.CallID != uint64(100+i) {
			t.Fatalf("request %d: %v, %v", 100+i, f, err)
		}
		f.Release()
	}
	if n := writes() - before; n != 1 {
		t.Errorf("%d requests written during a burst took %d writes, want 1", burst-2, n)
	}

	// A Cancel goes at once, even while answers wait unread.
	sendAnswers(200, 201)
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 300}); err != nil {
		t.Fatal(err)
	}
	if f, err := server.ReadFrame(ctx); err != nil || f.Type != kernel.FrameCancel {
		t.Fatalf("the Cancel written while an answer waited unread did not arrive: %v, %v", f, err)
	} else {
		f.Release()
	}
}

func readAnswer(t *testing.T, ctx context.Context, c *conn, id uint64) {
	t.Helper()
	f, err := c.ReadFrame(ctx)
	if err != nil || f.CallID != id {
		t.Fatalf("answer %d: %v, %v", id, f, err)
	}
	f.Release()
}

// pipeConn is a tcp-lv connection over net.Pipe: nothing is buffered
// between the ends, so every byte accepted and not read by peer is held
// by the connection itself.
func pipeConn(t *testing.T, o *Options) (c *conn, peer net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	c = newConn(newTransport(t, o), a, a, false)
	t.Cleanup(func() { b.Close(); c.Close() })
	return c, b
}

func maxFrame(t *testing.T, c *conn, maxSize int) *kernel.Frame {
	f := &kernel.Frame{Type: kernel.FrameResponse, CallID: 7}
	n := maxSize - (kernel.FrameHeaderLen(f) - kernel.FramePrefixLen)
	f.Payload = append(c.Buffer(n), make([]byte, n)...)
	return f
}

// TestTwoLargestFramesFitTheSmallestWriteQueue: validate lets
// max_write_queue be as small as twice max_frame_size because "two
// frames of the largest size must always fit, or a healthy peer receiving
// large answers would be cut off". Two largest answers queued behind a
// write in flight must not kill the connection.
func TestTwoLargestFramesFitTheSmallestWriteQueue(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	o.MaxWriteQueue = 2 * o.MaxFrameSize
	c, peer := pipeConn(t, o)
	// A small direct write, in flight while the peer is a moment late.
	go c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1})
	time.Sleep(50 * time.Millisecond)
	for i := range 2 {
		if err := c.QueueFrame(maxFrame(t, c, int(o.MaxFrameSize))); err != nil {
			t.Fatalf("largest frame %d of 2 queued behind a write in flight: %v", i+1, err)
		}
	}
	// The peer now reads: it was healthy all along.
	go io.Copy(io.Discard, peer)
}

// TestWriteQueueHoldsNoMoreThanMaxWriteQueue: with a peer that reads
// nothing, the bytes the connection holds for it (the batch the writer
// took, blocked in its write, and the queue behind it) must stay within
// max_write_queue; net.Pipe buffers nothing, so every frame accepted is
// held.
func TestWriteQueueHoldsNoMoreThanMaxWriteQueue(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	o.MaxWriteQueue = 256 << 10
	c, peer := pipeConn(t, o)
	small := &kernel.Frame{Type: kernel.FrameResponse, CallID: 1}
	smallLen := len(encode(small))
	go c.WriteFrame(small) // direct, blocked: the peer reads nothing yet
	time.Sleep(50 * time.Millisecond)
	frameLen := 0
	accepted := 0
	queue := func() error {
		f := &kernel.Frame{Type: kernel.FrameResponse, CallID: 2, Payload: append(c.Buffer(16<<10), make([]byte, 16<<10)...)}
		frameLen = len(encode(f))
		err := c.QueueFrame(f)
		if err == nil {
			accepted += frameLen
		}
		return err
	}
	// Fill the queue behind the blocked direct write, up to the limit.
	for accepted+frameLen <= int(o.MaxWriteQueue)-frameLen {
		if err := queue(); err != nil {
			t.Fatalf("queueing %d bytes: %v", accepted, err)
		}
	}
	// The peer reads the small frame alone: the writer goroutine takes
	// the queue and blocks writing it.
	if _, err := io.ReadFull(peer, make([]byte, smallLen)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for {
		if err := queue(); err != nil {
			break
		}
	}
	if accepted > int(o.MaxWriteQueue) {
		t.Fatalf("the connection accepted %d bytes for a peer that read none of them before cutting it off; max_write_queue is %d", accepted, o.MaxWriteQueue)
	}
}

// TestAFrameTheFailedFlushSentWholeIsNotReportedUnsent: a caller that
// finds the socket free but frames queued flushes them with its own; a
// frame another caller queues meanwhile must not ride in that write
// behind it. If it does, and the write fails in that frame, the flushing
// caller's WriteFrame returns the failure though its own frame reached
// the peer whole: the engine takes that error for "not sent" and sends
// the call again on another connection, and the server runs it twice.
//
// The flushing caller is held between queueing its frame and writing
// (in the Put of its payload's buffer, on a free list's lock the test
// holds), while the other caller queues; the peer then reads exactly
// the frames before the other one and hangs up.
func TestAFrameTheFailedFlushSentWholeIsNotReportedUnsent(t *testing.T) {
	c, peer := pipeConn(t, testOptions())
	queued := &kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "/s/m", Payload: []byte("queued before")}
	want := encode(queued)
	if err := c.enqueue(queued, nil); err != nil { // as a caller that found the socket busy
		t.Fatal(err)
	}
	// The flushing caller's payload: copied into the queue, then its
	// buffer (1 KiB: the own pool's second class) goes back to the pool.
	payload := append(make([]byte, 0, 1024), "flushed"...)
	flushed := &kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Method: "/s/m", Payload: payload}
	want = append(want, encode(flushed)...)
	class := reflect.ValueOf(c.pool.own).Elem().FieldByName("classes").Index(1).FieldByName("mu")
	held := (*sync.Mutex)(unsafe.Pointer(class.UnsafeAddr()))
	held.Lock()
	done := make(chan error, 1)
	go func() { done <- c.WriteFrame(flushed) }()
	// Its frame is in the queue, or in the batch it took for its write.
	for c.queued.Load() != 2 && c.inflight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// The flushing caller holds wmu: this one queues and returns.
	later := &kernel.Frame{Type: kernel.FrameRequest, CallID: 3, Method: "/s/m", Payload: []byte("queued after")}
	if err := c.WriteFrame(later); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		n, _ := io.ReadFull(peer, b)
		peer.Close() // the peer dies with the frames it read
		got <- b[:n]
	}()
	held.Unlock()
	err := <-done
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %q, want the two frames before the later one, whole: %q", b, want)
	}
	if err != nil {
		t.Fatalf("WriteFrame of call 2 = %v, though the peer read its frame whole: the engine would send it again, and it would run twice", err)
	}
}

// TestAFramePartlyWrittenIsReportedUnsent: the other half of WriteFrame's
// promise. A frame whose write fails before its last byte never reached
// the peer whole, so no server ran it: WriteFrame says so with an error
// that is not a *Status (the connection died), and the engine may send
// the call again elsewhere.
func TestAFramePartlyWrittenIsReportedUnsent(t *testing.T) {
	c, peer := pipeConn(t, testOptions())
	f := &kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "/s/m", Payload: []byte("cut short")}
	n := len(encode(f)) - 1
	go func() {
		io.ReadFull(peer, make([]byte, n))
		peer.Close()
	}()
	err := c.WriteFrame(f)
	var st *kernel.Status
	if err == nil || errors.As(err, &st) || c.Err() == nil {
		t.Fatalf("WriteFrame of a frame the peer got %d of %d bytes of = %v (connection: %v); want the connection's death, which says it was not sent", n, n+1, err, c.Err())
	}
}
