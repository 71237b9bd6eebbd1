package tcplv

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func TestFramesOfEverySizeUpToTheMaximumArriveIntact(t *testing.T) {
	client, server := connPair(t, testOptions())
	largest := kernel.DefaultMaxFrameSize - kernel.FrameFixedLen
	sizes := []struct {
		name string
		n    int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"16 B", 16},
		{"just below the copy limit", copyLimit - 1},
		{"at the copy limit (sent by writev)", copyLimit},
		{"64 KiB", 64 << 10},
		{"1 MiB (largest pooled)", maxPooledSize},
		{"above the pool", maxPooledSize + 1},
		{"exactly max_frame_size", largest},
	}
	for i, tc := range sizes {
		t.Run(tc.name, func(t *testing.T) {
			want := pattern(tc.n, byte(i))
			payload := append(client.Buffer(tc.n), want...)
			errc := make(chan error, 1)
			go func() {
				errc <- client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(i), Payload: payload})
			}()
			f, err := server.ReadFrame(timeout(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Release()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if f.CallID != uint64(i) || !bytes.Equal(f.Payload, want) {
				t.Fatalf("got call %d with %d bytes, want call %d with %d bytes intact", f.CallID, len(f.Payload), i, tc.n)
			}
		})
	}
}

func TestFrameOverTheMaximumIsRefusedLocallyAndTheConnectionStaysUsable(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	client, server := connPair(t, o)
	err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, Payload: make([]byte, 64<<10)})
	if !errors.Is(err, kernel.ErrFrameTooLarge) {
		t.Fatalf("WriteFrame of an oversized frame: %v, want ErrFrameTooLarge", err)
	}
	// A *Status is how WriteFrame says that the frame alone was refused:
	// any other error tells the kernel the connection is dead, and it
	// would fail every call on it (or, on the server, leave the client
	// waiting for an answer that never comes).
	var st *kernel.Status
	if !errors.As(err, &st) || st.Code != kernel.ResourceExhausted {
		t.Fatalf("WriteFrame of an oversized frame: %v, want a *kernel.Status ResourceExhausted", err)
	}
	if err := client.Err(); err != nil {
		t.Fatalf("the connection died of a refused frame: %v", err)
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 7}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil || f.CallID != 7 {
		t.Fatalf("after the refused frame: %v %v", f, err)
	}
	f.Release()
}

func TestEveryFieldCrossesTheWire(t *testing.T) {
	client, server := connPair(t, testOptions())
	want := kernel.Frame{
		Type: kernel.FrameResponse, Flags: kernel.FlagEndStream | kernel.FlagRetryable, CallID: 1<<64 - 1,
		Method: "Echo.Say", Codec: "protobuf", Timeout: 1500 * time.Millisecond,
		Code: kernel.Unavailable, Message: "shutting down", Credit: 1 << 20,
		Metadata: kernel.Metadata{"trace-id": "abc", "empty": ""},
		Payload:  []byte("payload"),
	}
	send := want
	send.Payload = append([]byte(nil), want.Payload...)
	if err := client.WriteFrame(&send); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if f.Type != want.Type || f.Flags != want.Flags || f.CallID != want.CallID || f.Method != want.Method ||
		f.Codec != want.Codec || f.Timeout != want.Timeout || f.Code != want.Code || f.Message != want.Message ||
		f.Credit != want.Credit || !maps.Equal(f.Metadata, want.Metadata) || !bytes.Equal(f.Payload, want.Payload) {
		t.Fatalf("got  %+v\nwant %+v", *f, want)
	}
}

// TestConcurrentWritersFramesIntactInOrderAndCoalesced: 64 goroutines
// share one connection; every frame arrives intact, each sender's frames in
// the order sent, and queued frames leave in batches (fewer write calls
// than frames).
func TestConcurrentWritersFramesIntactInOrderAndCoalesced(t *testing.T) {
	const writers, perWriter = 64, 100
	sizes := []int{16, 200, 3000, copyLimit + 1000}
	client, server := connPair(t, testOptions())

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for seq := range perWriter {
				n := sizes[(w+seq)%len(sizes)]
				buf := client.Buffer(n)[:n]
				copy(buf, pattern(n, byte(w+seq)))
				binary.BigEndian.PutUint32(buf, uint32(seq))
				if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(w), Payload: buf}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	next := make([]int, writers)
	ctx := timeout(t, 30*time.Second)
	for range writers * perWriter {
		f, err := server.ReadFrame(ctx)
		if err != nil {
			t.Fatalf("after %v frames: %v", next, err)
		}
		w := int(f.CallID)
		seq := next[w]
		n := sizes[(w+seq)%len(sizes)]
		want := pattern(n, byte(w+seq))
		binary.BigEndian.PutUint32(want, uint32(seq))
		if !bytes.Equal(f.Payload, want) {
			t.Fatalf("writer %d frame %d: got %d bytes starting % x, want %d bytes starting % x (out of order or corrupt)",
				w, seq, len(f.Payload), f.Payload[:min(8, len(f.Payload))], n, want[:8])
		}
		next[w]++
		f.Release()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	client.wmu.Lock()
	writes, frames := client.writes, client.framesOut
	client.wmu.Unlock()
	t.Logf("%d frames in %d write calls (%.1f frames per write)", frames, writes, float64(frames)/float64(writes))
	if frames != writers*perWriter {
		t.Fatalf("%d frames written, want %d", frames, writers*perWriter)
	}
	if writes >= frames {
		t.Fatalf("%d write calls for %d frames: concurrent writers were not coalesced", writes, frames)
	}
}

// TestInterruptedReadResumesWhereItStopped cuts a frame into pieces that
// arrive apart; each ReadFrame interrupted in between returns ctx's error,
// and the next one continues from the same byte.
func TestInterruptedReadResumesWhereItStopped(t *testing.T) {
	big := &kernel.Frame{Type: kernel.FrameRequest, CallID: 9, Method: "Echo.Say",
		Metadata: kernel.Metadata{"k": "v"}, Payload: pattern(300<<10, 3)}
	small := &kernel.Frame{Type: kernel.FrameRequest, CallID: 8, Method: "Echo.Say", Payload: pattern(100, 1)}
	cases := []struct {
		name   string
		frame  *kernel.Frame
		cuts   []int
		cancel bool // cancel the ctx instead of letting its deadline pass
	}{
		{"inside the length prefix", small, []int{2}, false},
		{"inside the fixed header", small, []int{4 + 7}, false},
		{"inside the fields", small, []int{4 + kernel.FrameFixedLen + 3}, true},
		{"inside the payload", small, []int{len(encode(small)) - 10}, false},
		{"twice inside a large payload read straight into the frame buffer", big, []int{100 << 10, 200 << 10}, true},
		{"at every stage", big, []int{1, 5, 30, 150 << 10}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, server := rawPair(t, testOptions())
			wire := encode(tc.frame)
			prev := 0
			for _, cut := range tc.cuts {
				if _, err := raw.Write(wire[prev:cut]); err != nil {
					t.Fatal(err)
				}
				prev = cut
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				if tc.cancel {
					time.AfterFunc(10*time.Millisecond, cancel)
				}
				f, err := server.ReadFrame(ctx)
				cancel()
				if err == nil {
					t.Fatalf("ReadFrame returned call %d before the frame was complete", f.CallID)
				}
				if !errors.Is(err, ctx.Err()) {
					t.Fatalf("interrupted ReadFrame: %v, want ctx's error %v", err, ctx.Err())
				}
				if server.Err() != nil {
					t.Fatalf("interruption killed the connection: %v", server.Err())
				}
			}
			if _, err := raw.Write(wire[prev:]); err != nil {
				t.Fatal(err)
			}
			f, err := server.ReadFrame(timeout(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Release()
			if f.CallID != tc.frame.CallID || f.Method != tc.frame.Method || !bytes.Equal(f.Payload, tc.frame.Payload) {
				t.Fatalf("resumed frame: call %d %q %d bytes, want call %d %q %d bytes intact",
					f.CallID, f.Method, len(f.Payload), tc.frame.CallID, tc.frame.Method, len(tc.frame.Payload))
			}
		})
	}
}

func TestReadFrameWithADoneContextReturnsAtOnceAndKeepsTheConnection(t *testing.T) {
	client, server := connPair(t, testOptions())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := server.ReadFrame(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadFrame with a cancelled ctx: %v", err)
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 3}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil || f.CallID != 3 {
		t.Fatalf("%v %v", f, err)
	}
	f.Release()
}

// A second reader while one waits breaks the one-reader rule: it is told
// so, and the waiting read goes on undisturbed.
func TestASecondConcurrentReadFrameIsRefused(t *testing.T) {
	client, server := connPair(t, testOptions())
	first := make(chan *kernel.Frame, 1)
	go func() {
		f, err := server.ReadFrame(timeout(t, 10*time.Second))
		if err != nil {
			t.Errorf("the waiting ReadFrame: %v", err)
		}
		first <- f
	}()
	for !server.reading.Load() {
		time.Sleep(time.Millisecond)
	}
	if _, err := server.ReadFrame(context.Background()); err == nil || !strings.Contains(err.Error(), "ReadFrame called while another ReadFrame is in progress") {
		t.Fatalf("a second ReadFrame at once: %v", err)
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 4}); err != nil {
		t.Fatal(err)
	}
	if f := <-first; f == nil || f.CallID != 4 {
		t.Fatalf("the waiting ReadFrame got %v", f)
	} else {
		f.Release()
	}
}

// A frame already in the read buffer is taken without arming ctx's
// AfterFunc, so a cancellable ctx costs nothing there; the read that
// follows a buffered Ping still waits for ctx.
func TestBufferedFramesNeedNoContextHookAndABlockingReadStillHonoursCtx(t *testing.T) {
	o := testOptions()
	o.ReadBufferSize = 64 << 10 // room for the thousand frames below
	raw, server := rawPair(t, o)
	frames := 1001 // AllocsPerRun runs once more than asked
	var wire []byte
	for i := range frames {
		wire = append(wire, encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: uint64(i + 1)})...)
	}
	wire = append(wire, encode(&kernel.Frame{Type: kernel.FramePing, CallID: 99})...)
	go raw.Write(wire)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := server.ReadFrame(ctx) // waits for the bytes, then fills the buffer
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	// Wait until the rest is in the read buffer.
	if _, err := server.br.Peek(len(wire) - len(encode(f))); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(frames-2, func() {
		f, err := server.ReadFrame(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f.Release()
	})
	if allocs != 0 {
		t.Errorf("ReadFrame of buffered frames with a cancellable ctx: %.1f allocations, want 0", allocs)
	}
	// Only the Ping is left: it is answered, and the read after it blocks
	// until ctx is cancelled.
	time.AfterFunc(20*time.Millisecond, cancel)
	done := make(chan error, 1)
	go func() {
		_, err := server.ReadFrame(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ReadFrame after the buffered Ping: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadFrame after a buffered Ping ignored the cancelled ctx")
	}
}

func TestPingIsAnsweredWithItsPayloadAndNeitherIsReturned(t *testing.T) {
	raw, server := rawPair(t, testOptions())
	ping := &kernel.Frame{Type: kernel.FramePing, CallID: 77, Payload: []byte("are you there")}
	pong := &kernel.Frame{Type: kernel.FramePong, CallID: 5}
	after := &kernel.Frame{Type: kernel.FrameCancel, CallID: 6}
	raw.Write(append(append(encode(ping), encode(pong)...), encode(after)...))
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if f.Type != kernel.FrameCancel || f.CallID != 6 {
		t.Fatalf("ReadFrame returned %v %d, want the Cancel after the Ping and Pong", f.Type, f.CallID)
	}
	f.Release()
	want := encode(&kernel.Frame{Type: kernel.FramePong, CallID: 77, Payload: []byte("are you there")})
	got := make([]byte, len(want))
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(raw, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("answer to the Ping:\n got % x\nwant % x", got, want)
	}
}

func TestCloseUnblocksPendingReadsOnBothEnds(t *testing.T) {
	client, server := connPair(t, testOptions())
	type result struct {
		side string
		err  error
	}
	results := make(chan result, 2)
	for side, c := range map[string]*conn{"client": client, "server": server} {
		go func() {
			_, err := c.ReadFrame(context.Background())
			results <- result{side, err}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	client.Close()
	want := map[string]error{"client": kernel.ErrClosed, "server": kernel.ErrPeerGone}
	for range 2 {
		select {
		case r := <-results:
			if !errors.Is(r.err, want[r.side]) {
				t.Errorf("%s's pending ReadFrame: %v, want an error wrapping %v", r.side, r.err, want[r.side])
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a pending ReadFrame is still blocked after Close")
		}
	}
}

func TestOperationsAfterCloseFail(t *testing.T) {
	client, server := connPair(t, testOptions())
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-client.Done():
	default:
		t.Fatal("Done is not closed after Close")
	}
	if !errors.Is(client.Err(), kernel.ErrClosed) {
		t.Fatalf("Err after Close: %v", client.Err())
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, Payload: client.Buffer(10)}); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("WriteFrame after Close: %v", err)
	}
	if _, err := client.ReadFrame(context.Background()); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("ReadFrame after Close: %v", err)
	}
	// The peer hears it, and its own writes then fail as peer gone.
	if _, err := server.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("peer's ReadFrame: %v", err)
	}
	if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse}); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("peer's WriteFrame: %v", err)
	}
}

func TestFramesQueuedBeforeCloseReachThePeer(t *testing.T) {
	client, server := connPair(t, testOptions())
	// Hold the socket as a write in flight would, so the GoAway is queued.
	client.wmu.Lock()
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway}); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, client.wmu.Unlock)
	client.Close()
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("the GoAway queued before Close was lost: %v", err)
	}
	if f.Type != kernel.FrameGoAway {
		t.Fatalf("got %v, want GoAway", f.Type)
	}
	f.Release()
}

func TestBufferHasTheCapacityAskedForAndRecycledBuffersAreReused(t *testing.T) {
	c, _ := connPair(t, testOptions())
	for _, n := range []int{-1, 0, 1, 511, 512, 513, 4096, maxPooledSize, maxPooledSize + 1} {
		b := c.Buffer(n)
		if len(b) != 0 || cap(b) < n {
			t.Errorf("Buffer(%d): len %d cap %d", n, len(b), cap(b))
		}
		c.Recycle(b)
	}
	b := c.Buffer(1000)
	c.Recycle(b)
	if again := c.Buffer(1000); &again[:1][0] != &b[:1][0] {
		t.Error("a recycled buffer was not reused")
	}
}

// Large buffers are the transport's: one connection's recycled buffer
// serves another's next one. Small ones stay with their connection.
func TestLargeBuffersAreSharedByTheTransportsConnections(t *testing.T) {
	client, server := connPair(t, testOptions()) // one transport: both ends
	large := client.Buffer(64 << 10)
	client.Recycle(large)
	if again := server.Buffer(64 << 10); &again[:1][0] != &large[:1][0] {
		t.Error("a large buffer one connection recycled was not reused by another of its transport")
	}
	small := client.Buffer(ownMax)
	client.Recycle(small)
	if other := server.Buffer(ownMax); &other[:1][0] == &small[:1][0] {
		t.Error("a small buffer one connection recycled went to another")
	}
	if again := client.Buffer(ownMax); &again[:1][0] != &small[:1][0] {
		t.Error("a small recycled buffer was not reused by its connection")
	}
	// Another transport's connections have a pool of their own.
	other, _ := connPair(t, testOptions())
	recycled := client.Buffer(128 << 10)
	client.Recycle(recycled)
	if b := other.Buffer(128 << 10); &b[:1][0] == &recycled[:1][0] {
		t.Error("a buffer recycled on one transport went to another transport's connection")
	}
}

// TestCloseWriteDeliversWhatWasSentThenEOFWhileStillReading is how a
// draining server ends a connection: its last frames arrive, then EOF,
// and a frame that crossed them is still read. (A Cancel: a request
// written on a connection idle since the peer's FIN came is not sent at
// all on Linux, which sees the FIN in the socket's state; see
// TestARequestIsNotWrittenWhereThePeerHungUpWhileIdle.)
func TestCloseWriteDeliversWhatWasSentThenEOFWhileStillReading(t *testing.T) {
	client, server := connPair(t, testOptions())
	server.wmu.Lock() // as if a write were in flight: the GoAway is queued
	if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway}); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, server.wmu.Unlock)
	if err := server.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := server.CloseWrite(); err != nil {
		t.Fatalf("second CloseWrite: %v", err)
	}
	if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse}); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("WriteFrame after CloseWrite: %v, want ErrClosed", err)
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 4}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil || f.CallID != 4 {
		t.Fatalf("reading after CloseWrite: %v %v", f, err)
	}
	f.Release()
	if f, err = client.ReadFrame(timeout(t, 5*time.Second)); err != nil || f.Type != kernel.FrameGoAway {
		t.Fatalf("client got %v %v, want the GoAway sent before CloseWrite", f, err)
	}
	f.Release()
	if _, err := client.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("client after the GoAway: %v, want peer gone (EOF)", err)
	}
	// The client hung up in turn; the server hears it and its Done closes.
	if _, err := server.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("server: %v", err)
	}
	<-server.Done()
}

func TestBufferedCountsBytesReadFrameCanTakeWithoutWaiting(t *testing.T) {
	raw, server := rawPair(t, testOptions())
	second := encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: []byte("second")})
	raw.Write(append(encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1}), second...))
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	if n := server.Buffered(); n != len(second) {
		t.Fatalf("Buffered after the first of two frames = %d, want %d", n, len(second))
	}
	if f, err = server.ReadFrame(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.Release()
	if n := server.Buffered(); n != 0 {
		t.Fatalf("Buffered after both frames = %d", n)
	}
}

// The spare small buffer goes to one holder at a time: buffers taken
// without a Recycle between are distinct, the one recycled is the next
// one lent, and senders taking and recycling at once never share one.
func TestSmallBuffersAreNeverLentTwice(t *testing.T) {
	c, _ := connPair(t, testOptions())
	a, b := c.Buffer(16), c.Buffer(16)
	if &a[:1][0] == &b[:1][0] {
		t.Fatal("two small buffers taken one after the other share memory")
	}
	c.Recycle(a)
	if again := c.Buffer(16); &again[:1][0] != &a[:1][0] {
		t.Error("the small buffer just recycled was not the next one lent")
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				buf := c.Buffer(16)[:16]
				mark := byte(g*31 + i)
				for j := range buf {
					buf[j] = mark
				}
				runtime.Gosched()
				for j := range buf {
					if buf[j] != mark {
						t.Errorf("a small buffer held by one sender was written by another")
						return
					}
				}
				c.Recycle(buf)
			}
		})
	}
	wg.Wait()
}
