//go:build linux

package shmring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kernrpc/kernrpc/kernel"
)

// inSegment reports whether b lies in the memory c shares with its peer.
func inSegment(c *conn, b []byte) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(c.seg.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return cap(b) > 0 && p >= lo && p < lo+uintptr(len(c.seg.mem))
}

// echoFrames reads frames on s and writes each back, until s dies.
func echoFrames(s kernel.Conn) {
	for {
		f, err := s.ReadFrame(context.Background())
		if err != nil {
			return
		}
		back := *f
		back.Payload = append(s.Buffer(len(f.Payload)), f.Payload...)
		f.Release()
		if s.WriteFrame(&back) != nil {
			return
		}
	}
}

func TestFramesOfEverySizeRoundTripIncludingFourTimesTheRing(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 1 << 20
	c, s := connPair(t, o)
	go echoFrames(s)
	ring := int(o.RingSize)
	for i, n := range []int{0, 1, 7, 8, 16, 1000, ring/4 - lentPrefix, ring/4 - lentPrefix + 1, ring / 2, ring, 4 * ring} {
		p := pattern(n, byte(i))
		f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: uint64(i + 1), Method: "Echo.Echo",
			Codec: "protobuf", Timeout: time.Second, Metadata: kernel.Metadata{"k": "v"}}
		send(t, c, f, p)
		got := recv(t, c)
		if got.CallID != uint64(i+1) || got.Method != "Echo.Echo" || got.Codec != "protobuf" || got.Timeout != time.Second ||
			got.Metadata["k"] != "v" || got.Flags != kernel.FlagEndStream || !bytes.Equal(got.Payload, p) {
			t.Fatalf("%d-byte frame came back as call %d, %q, %d bytes", n, got.CallID, got.Method, len(got.Payload))
		}
		// A frame that fits one record is read in place; a larger one
		// was assembled from chunks.
		if fits := align8(recordHeaderLen+kernel.FrameHeaderLen(f)+n) <= ring/4; fits != inSegment(c, got.Payload) && n > 0 {
			t.Errorf("%d-byte payload: read in place %t, want %t", n, !fits, fits)
		}
		got.Release()
	}
}

func TestBufferLendsRingMemoryAndWriteFrameSendsItInPlace(t *testing.T) {
	c, s := connPair(t, testOptions())
	buf := c.Buffer(100)
	if !inSegment(c, buf) || cap(buf) < 100 || len(buf) != 0 {
		t.Fatalf("Buffer(100) gave len %d cap %d, in the segment %t", len(buf), cap(buf), inSegment(c, buf))
	}
	payload := append(buf, pattern(100, 3)...)
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 9, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	f := recv(t, s)
	defer f.Release()
	if !bytes.Equal(f.Payload, pattern(100, 3)) {
		t.Fatal("payload changed on the way")
	}
	// Same bytes, same place: the reader sees the very memory the codec
	// wrote (the two mappings of one page differ only in address).
	off := func(c *conn, b []byte) uintptr {
		return uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(c.seg.mem)))
	}
	if off(c, payload) != off(s, f.Payload) {
		t.Fatalf("payload written at segment offset %d was read at %d: it was copied", off(c, payload), off(s, f.Payload))
	}
	if big := c.Buffer(int(testOptions().RingSize)); inSegment(c, big) {
		t.Fatal("Buffer lent ring memory for a payload larger than a record")
	}
}

func TestHeldBufferDoesNotStallOthersAndIsNotReused(t *testing.T) {
	c, s := connPair(t, testOptions())
	held := append(c.Buffer(64), pattern(64, 1)...)
	// Enough traffic to go round the ring several times.
	for i := range 200 {
		p := pattern(1000, byte(i))
		send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i)}, p)
		f := recv(t, s)
		if f.CallID != uint64(i) || !bytes.Equal(f.Payload, p) {
			t.Fatalf("frame %d arrived as call %d with %d bytes", i, f.CallID, len(f.Payload))
		}
		f.Release()
	}
	if !bytes.Equal(held, pattern(64, 1)) {
		t.Fatal("a held buffer was overwritten")
	}
	// Sent late, it still arrives intact (copied, its place having been
	// skipped).
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1000, Payload: held}); err != nil {
		t.Fatal(err)
	}
	f := recv(t, s)
	if f.CallID != 1000 || !bytes.Equal(f.Payload, pattern(64, 1)) {
		t.Fatalf("late frame arrived as call %d with %d bytes", f.CallID, len(f.Payload))
	}
	f.Release()
	c.out.mu.Lock()
	islands := len(c.out.islands)
	c.out.mu.Unlock()
	if islands != 0 {
		t.Fatalf("%d islands left after the held buffer was sent", islands)
	}
}

func TestHeldFrameDoesNotStallTheWriter(t *testing.T) {
	c, s := connPair(t, testOptions())
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}, pattern(2000, 1))
	held := recv(t, s)
	// Several rings' worth passes the held frame, which the writer skips
	// once the reader, waiting for more, lists it.
	for i := range 200 {
		sent := make(chan error, 1)
		go func() {
			p := append(c.Buffer(1000), pattern(1000, byte(i))...)
			sent <- c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i + 2), Payload: p})
		}()
		f := recv(t, s)
		if err := <-sent; err != nil {
			t.Fatalf("frame %d: %v", i+2, err)
		}
		if f.CallID != uint64(i+2) || !bytes.Equal(f.Payload, pattern(1000, byte(i))) {
			t.Fatalf("frame %d arrived as call %d", i+2, f.CallID)
		}
		f.Release()
	}
	if held.CallID != 1 || !bytes.Equal(held.Payload, pattern(2000, 1)) {
		t.Fatal("a held frame changed while the writer went round the ring")
	}
	if n := s.in.r.nheld.Load(); n != 1 {
		t.Fatalf("%d records listed as held, want the one", n)
	}
	held.Release()
	if n := s.in.r.nheld.Load(); n != 0 {
		t.Fatalf("%d records listed as held after its release", n)
	}
}

func TestRecycledAndOutgrownBuffersFreeTheirSpace(t *testing.T) {
	c, s := connPair(t, testOptions())
	for i := range 1000 {
		b := c.Buffer(1000)
		if i%2 == 0 {
			c.Recycle(b)
			continue
		}
		// The encoding outgrows the loan, as a codec without a size hint
		// may: the loan goes back, the grown slice is sent.
		grown := append(b, pattern(5000, byte(i))...)
		c.Recycle(b)
		if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i), Payload: grown}); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		f := recv(t, s)
		if f.CallID != uint64(i) || !bytes.Equal(f.Payload, pattern(5000, byte(i))) {
			t.Fatalf("frame %d arrived as call %d", i, f.CallID)
		}
		f.Release()
	}
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	if c.out.slots.n != 0 || len(c.out.islands) != 0 || c.out.cursor != c.out.head {
		t.Fatalf("after every buffer was sent or recycled: %d slots, %d islands, cursor %d, head %d",
			c.out.slots.n, len(c.out.islands), c.out.cursor, c.out.head)
	}
}

func TestConcurrentCallersShareOneConnection(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 1 << 20
	c, s := connPair(t, o)
	// The peer echoes from as many goroutines as there are callers, each
	// holding its frame a while, so that releases come out of order.
	go func() {
		var wg sync.WaitGroup
		for {
			f, err := s.ReadFrame(context.Background())
			if err != nil {
				break
			}
			wg.Go(func() {
				back := *f
				back.Payload = append(s.Buffer(len(f.Payload)), f.Payload...)
				time.Sleep(time.Duration(f.CallID%3) * 100 * time.Microsecond)
				f.Release()
				s.WriteFrame(&back)
			})
		}
		wg.Wait()
	}()
	const callers, calls = 32, 30
	var mu sync.Mutex
	waiting := map[uint64]chan *kernel.Frame{}
	readerDone := make(chan error, 1)
	go func() {
		for {
			f, err := c.ReadFrame(context.Background())
			if err != nil {
				readerDone <- err
				return
			}
			mu.Lock()
			ch := waiting[f.CallID]
			delete(waiting, f.CallID)
			mu.Unlock()
			ch <- f
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range calls {
				id := uint64(g*calls + i + 1)
				n := []int{16, 3000, 40000, 200000}[(g+i)%4]
				p := pattern(n, byte(id))
				ch := make(chan *kernel.Frame, 1)
				mu.Lock()
				waiting[id] = ch
				mu.Unlock()
				f := &kernel.Frame{Type: kernel.FrameRequest, CallID: id, Payload: append(c.Buffer(n), p...)}
				if err := c.WriteFrame(f); err != nil {
					errs <- err
					return
				}
				select {
				case got := <-ch:
					ok := bytes.Equal(got.Payload, p)
					got.Release()
					if !ok {
						errs <- fmt.Errorf("call %d: its answer carries another payload", id)
						return
					}
				case <-time.After(10 * time.Second):
					errs <- fmt.Errorf("call %d: no answer", id)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStalledReaderMakesTheWriterWaitThenFailWithResourceExhausted(t *testing.T) {
	o := testOptions()
	o.WaitTimeout = kernel.Duration(200 * time.Millisecond)
	c, s := connPair(t, o)
	var sent [][]byte
	var err error
	var took time.Duration
	for i := 0; i < 1000 && err == nil; i++ {
		p := pattern(6000, byte(i))
		start := time.Now()
		f := &kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i), Payload: append(c.Buffer(len(p)), p...)}
		if err = c.WriteFrame(f); err == nil {
			sent = append(sent, p)
		}
		took = time.Since(start)
	}
	if kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("writing to a reader that reads nothing: %v, want status ResourceExhausted", err)
	}
	if took < o.WaitTimeout.D() {
		t.Fatalf("the write failed after %v, before wait_timeout %v: it did not wait", took, o.WaitTimeout.D())
	}
	if c.Err() != nil {
		t.Fatalf("the connection died: %v", c.Err())
	}
	// Nothing was dropped: the reader finds every frame that was accepted,
	// and none of the refused one.
	for i, p := range sent {
		f := recv(t, s)
		if f.CallID != uint64(i) || !bytes.Equal(f.Payload, p) {
			t.Fatalf("frame %d arrived as call %d", i, f.CallID)
		}
		f.Release()
	}
	if n := s.Buffered(); n != 0 {
		t.Fatalf("%d bytes still buffered after the accepted frames", n)
	}
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 5000}, pattern(6000, 1))
	if f := recv(t, s); f.CallID != 5000 {
		t.Fatalf("after the reader caught up, the next frame arrived as call %d", f.CallID)
	} else {
		f.Release()
	}
}

func TestStalledReaderDuringAChunkedFrameLosesNothingAfterIt(t *testing.T) {
	o := testOptions()
	o.WaitTimeout = kernel.Duration(100 * time.Millisecond)
	c, s := connPair(t, o)
	// Three rings' worth cannot pass a reader that does not read: the
	// frame is given up on part way.
	err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Payload: pattern(3*int(o.RingSize), 1)})
	if kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("chunked frame to a stalled reader: %v", err)
	}
	// The reader drops the pieces it got and then reads the next frame.
	done := make(chan *kernel.Frame, 1)
	go func() { f, _ := s.ReadFrame(timeout(t, 10*time.Second)); done <- f }()
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 2}, pattern(100, 2))
	f := <-done
	if f == nil || f.CallID != 2 || !bytes.Equal(f.Payload, pattern(100, 2)) {
		t.Fatalf("the frame after the abandoned one: %v", f)
	}
	f.Release()
}

func TestOversizedFrameIsRefusedLocally(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 4096
	c, s := connPair(t, o)
	err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, Payload: make([]byte, 4096)})
	if !errors.Is(err, kernel.ErrFrameTooLarge) {
		t.Fatalf("WriteFrame over max_frame_size: %v", err)
	}
	// Refused alone: a *Status, or the kernel takes the connection for dead.
	if kernel.CodeOf(err) != kernel.ResourceExhausted || c.Err() != nil {
		t.Fatalf("WriteFrame over max_frame_size: %v (connection: %v), want a *kernel.Status ResourceExhausted on a live connection", err, c.Err())
	}
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 3}, pattern(100, 1))
	if f := recv(t, s); f.CallID != 3 {
		t.Fatalf("next frame: call %d", f.CallID)
	} else {
		f.Release()
	}
}

func TestReadFrameHonoursItsContextAndResumes(t *testing.T) {
	c, s := connPair(t, testOptions())
	start := time.Now()
	if _, err := s.ReadFrame(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadFrame with nothing to read: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("ReadFrame took %v to honour a 50ms deadline", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { _, err := s.ReadFrame(ctx); got <- err }()
	time.Sleep(20 * time.Millisecond) // let it fall asleep
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled ReadFrame: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the context did not wake ReadFrame")
	}
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 7}, []byte("after"))
	if f := recv(t, s); f.CallID != 7 || string(f.Payload) != "after" {
		t.Fatalf("frame after interrupted reads: %d %q", f.CallID, f.Payload)
	} else {
		f.Release()
	}
}

func TestCloseWakesBothEndsAndLaterOperationsFail(t *testing.T) {
	c, s := connPair(t, testOptions())
	local, peer := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.ReadFrame(context.Background()); local <- err }()
	go func() { _, err := s.ReadFrame(context.Background()); peer <- err }()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	for _, w := range []struct {
		ch   chan error
		want error
	}{{local, kernel.ErrClosed}, {peer, kernel.ErrPeerGone}} {
		select {
		case err := <-w.ch:
			if !errors.Is(err, w.want) {
				t.Errorf("pending ReadFrame: %v, want %v", err, w.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close left a ReadFrame blocked")
		}
	}
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest}); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("WriteFrame after Close: %v", err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's Done did not close")
	}
	c.Close() // idempotent
}

func TestFramesWrittenBeforeCloseAreDelivered(t *testing.T) {
	c, s := connPair(t, testOptions())
	for i := range 5 {
		send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i)}, pattern(100, byte(i)))
	}
	c.Close()
	for i := range 5 {
		f := recv(t, s)
		if f.CallID != uint64(i) {
			t.Fatalf("frame %d arrived as %d", i, f.CallID)
		}
		f.Release()
	}
	if _, err := s.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("ReadFrame after the last frame: %v", err)
	}
}

func TestCloseWriteDeliversWhatWasSentThenEndWhileStillReading(t *testing.T) {
	c, s := connPair(t, testOptions())
	send(t, s, &kernel.Frame{Type: kernel.FrameGoAway, CallID: 3}, nil)
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse}); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("WriteFrame after CloseWrite: %v", err)
	}
	// The server still reads.
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 4}, []byte("late"))
	if f := recv(t, s); f.CallID != 4 {
		t.Fatalf("request after CloseWrite: call %d", f.CallID)
	} else {
		f.Release()
	}
	if f := recv(t, c); f.Type != kernel.FrameGoAway {
		t.Fatalf("client read %v, want the GoAway", f.Type)
	} else {
		f.Release()
	}
	if _, err := c.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("client ReadFrame after the end: %v", err)
	}
}

func TestReleaseAfterCloseIsHarmlessAndUnmapsLast(t *testing.T) {
	c, s := connPair(t, testOptions())
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}, pattern(100, 1))
	f := recv(t, s)
	s.Close()
	c.Close()
	// The segment stays mapped while the payload is lent.
	if !bytes.Equal(f.Payload, pattern(100, 1)) {
		t.Fatal("lent payload changed after Close")
	}
	f.Release()
	if n := s.refs.Load(); n != 0 {
		t.Fatalf("%d references to the segment after the last frame came back", n)
	}
}

func TestBufferedCountsPublishedBytes(t *testing.T) {
	c, s := connPair(t, testOptions())
	if n := s.Buffered(); n != 0 {
		t.Fatalf("Buffered on an idle connection: %d", n)
	}
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}, pattern(100, 1))
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 2}, pattern(100, 2))
	if n := s.Buffered(); n == 0 {
		t.Fatal("Buffered is 0 with two frames published")
	}
	recv(t, s).Release()
	recv(t, s).Release()
	if n := s.Buffered(); n != 0 {
		t.Fatalf("Buffered after reading everything: %d", n)
	}
}

// The reader polls for the whole budget while answers come quickly, only
// glances once the average wait is far above it (an idle connection, a
// slow peer), and polls again once answers come quickly again.
func TestReaderPollsLessWhileWaitsAreLongAndAgainWhenTheyShorten(t *testing.T) {
	const spin = 50 * time.Microsecond
	var w waitStats
	for range 32 {
		w.observe(10 * time.Microsecond)
	}
	if got := w.budget(spin); got != spin {
		t.Fatalf("budget after quick answers = %s, want the whole %s", got, spin)
	}
	for range 32 {
		w.observe(10 * time.Millisecond)
	}
	if got := w.budget(spin); got >= spin {
		t.Fatalf("budget after 10ms waits = %s, want less than %s", got, spin)
	}
	for range 64 {
		w.observe(10 * time.Microsecond)
	}
	if got := w.budget(spin); got != spin {
		t.Fatalf("budget once answers are quick again = %s, want %s", got, spin)
	}
	// A few slow wake-ups among quick answers do not stop the polling.
	w = waitStats{}
	for i := range 64 {
		d := 10 * time.Microsecond
		if i%16 == 0 {
			d = 2 * time.Millisecond
		}
		w.observe(d)
	}
	if got := w.budget(spin); got != spin {
		t.Fatalf("budget with one 2ms wake-up in 16 = %s, want %s", got, spin)
	}
}
