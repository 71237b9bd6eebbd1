package faulty_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

const frames = 400

// quiet is how long a reader waits for frames that may not come: long
// enough for a loaded machine running -race not to pass for a lost frame.
const quiet = time.Second

// faultyDial builds a transport whose dialled connections have options'
// faults, and returns both ends.
func faultyDial(t *testing.T, options map[string]any) (dialed, accepted kernel.Conn) {
	t.Helper()
	o := map[string]any{"side": "dial", "seed": 7}
	for k, v := range options {
		o[k] = v
	}
	return pair(t, build(t, o))
}

func TestDropLosesAboutThatShareDeterministicallyBySeed(t *testing.T) {
	var runs [2][]uint64
	for i := range runs {
		d, a := faultyDial(t, map[string]any{"drop": 0.25})
		for _, err := range sendRequests(t, d, frames) {
			if err != nil {
				t.Fatalf("a dropped frame's write failed: %v; it must look sent", err)
			}
		}
		got, err := readFor(a, quiet)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got {
			if !bytes.Equal(r.payload, payloadOf(r.id)) {
				t.Fatalf("call %d arrived with payload %q; a frame not dropped must pass intact", r.id, r.payload)
			}
		}
		runs[i] = ids(got)
	}
	if n := len(runs[0]); n < frames*6/10 || n > frames*9/10 {
		t.Errorf("%d of %d frames arrived with drop 0.25", n, frames)
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Errorf("two runs with one seed dropped different frames:\n%v\n%v", runs[0], runs[1])
	}
}

// Turning a fault on must not change which frames the others hit: a test
// that adds truncate or corrupt to a failing drop run must still lose the
// same frames, or it no longer reproduces what it set out to debug.
func TestAnotherFaultDoesNotChangeWhichFramesAreDropped(t *testing.T) {
	arrived := func(options map[string]any) []uint64 {
		t.Helper()
		d, a := faultyDial(t, options)
		sendRequests(t, d, frames)
		got, err := readFor(a, quiet)
		if err != nil {
			t.Fatal(err)
		}
		return ids(got)
	}
	alone := arrived(map[string]any{"drop": 0.25})
	for _, other := range []string{"truncate", "corrupt"} {
		with := arrived(map[string]any{"drop": 0.25, other: 0.5})
		if !slices.Equal(alone, with) {
			t.Errorf("drop 0.25 with seed 7 let %d frames through alone and %d with %s 0.5: turning %s on changed which frames were dropped",
				len(alone), len(with), other, other)
		}
	}
}

func TestDuplicateSendsSomeFramesTwiceIntact(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"duplicate": 0.3})
	sendRequests(t, d, frames)
	got, err := readFor(a, quiet)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]int{}
	for _, r := range got {
		seen[r.id]++
		if !bytes.Equal(r.payload, payloadOf(r.id)) {
			t.Fatalf("call %d arrived with payload %q", r.id, r.payload)
		}
	}
	twice := 0
	for id := uint64(1); id <= frames; id++ {
		switch seen[id] {
		case 1:
		case 2:
			twice++
		default:
			t.Errorf("call %d arrived %d times", id, seen[id])
		}
	}
	if twice < frames/10 || twice > frames/2 {
		t.Errorf("%d of %d frames arrived twice with duplicate 0.3", twice, frames)
	}
}

func TestCorruptPayloadFlipsOneByteAndKeepsTheHeader(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"corrupt": 1})
	sendRequests(t, d, frames)
	got, err := readUpTo(a, frames, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != frames {
		t.Fatalf("%d of %d frames arrived", len(got), frames)
	}
	for i, r := range got {
		want := payloadOf(uint64(i + 1))
		if r.id != uint64(i+1) || r.method != "Echo.Say" || len(r.payload) != len(want) {
			t.Fatalf("frame %d arrived as call %d, method %q, %d bytes: the header must be intact", i+1, r.id, r.method, len(r.payload))
		}
		if diff := differing(r.payload, want); diff != 1 {
			t.Fatalf("call %d arrived with %d bytes changed; want one", r.id, diff)
		}
	}
}

// Corrupting the frame as a stream carries it gives the receiver what the
// damaged bytes decode to; once they do not decode, the connection ends.
func TestCorruptFrameAltersTheHeaderOrEndsTheConnection(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"corrupt": 1, "corrupt_in": "frame"})
	errs := sendRequests(t, d, frames)
	got, err := readFor(a, quiet)
	if err == nil {
		t.Fatalf("%d corrupted frames arrived and the connection lives; one in %d never decoding is unlikely", len(got), frames)
	}
	if dErr := d.Err(); !errors.Is(dErr, kernel.ErrPeerGone) || !strings.Contains(dErr.Error(), "corruption") {
		t.Errorf("the writer's Err is %v; want the injected corruption, wrapping ErrPeerGone", dErr)
	}
	if errs[len(errs)-1] == nil {
		t.Error("writes after the receiver closed the connection succeeded")
	}
	for _, r := range got {
		if r.asSent() {
			t.Errorf("call %d arrived unchanged with corrupt 1", r.id)
		}
	}
}

func TestTruncateCutsThePayloadShort(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"truncate": 1})
	sendRequests(t, d, frames)
	got, err := readUpTo(a, frames, quiet)
	if err != nil || len(got) != frames {
		t.Fatalf("%d of %d frames arrived (%v)", len(got), frames, err)
	}
	for _, r := range got {
		want := payloadOf(r.id)
		if len(r.payload) >= len(want) || !bytes.HasPrefix(want, r.payload) {
			t.Fatalf("call %d arrived with payload %q; want a proper prefix of %q", r.id, r.payload, want)
		}
	}
}

func TestResetAfterEndsTheConnectionInsteadOfTheNextFrame(t *testing.T) {
	const after = 10
	d, a := faultyDial(t, map[string]any{"reset_after": after})
	errs := sendRequests(t, d, after+5)
	for i, err := range errs {
		if i < after && err != nil {
			t.Fatalf("frame %d: %v; the first %d must be sent", i+1, err, after)
		}
		if i >= after && !errors.Is(err, kernel.ErrPeerGone) {
			t.Fatalf("frame %d: %v; want an error wrapping ErrPeerGone", i+1, err)
		}
	}
	if err := d.Err(); !errors.Is(err, kernel.ErrPeerGone) || !strings.Contains(err.Error(), "reset") {
		t.Errorf("Err is %v; want the injected reset", err)
	}
	select {
	case <-d.Done():
	case <-time.After(time.Second):
		t.Error("Done is not closed after the reset")
	}
	got, err := readFor(a, 2*time.Second)
	if err == nil {
		t.Error("the peer's connection lives on after a reset")
	}
	if len(got) > after {
		t.Errorf("the peer got %d frames; at most %d were sent", len(got), after)
	}
}

func TestStallAfterStopsWritingButReadsGoOn(t *testing.T) {
	const after = 10
	d, a := faultyDial(t, map[string]any{"stall_after": after})
	for i, err := range sendRequests(t, d, after+20) {
		if err != nil {
			t.Fatalf("frame %d: %v; a stalled write must be accepted", i+1, err)
		}
	}
	got, err := readFor(a, quiet)
	if err != nil || len(got) != after {
		t.Fatalf("the peer got %d frames (%v); want exactly %d", len(got), err, after)
	}
	if err := a.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if back, err := readUpTo(d, 1, quiet); err != nil || len(back) != 1 {
		t.Errorf("the stalled side read %d frames (%v); its reads must go on", len(back), err)
	}
}

func TestBlackholeTakesEverythingAndDeliversNothing(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"blackhole": true})
	for _, err := range sendRequests(t, d, 20) {
		if err != nil {
			t.Fatalf("a blackholed write failed: %v", err)
		}
	}
	if got, err := readFor(a, 200*time.Millisecond); err != nil || len(got) != 0 {
		t.Errorf("the peer got %d frames from a blackhole (%v)", len(got), err)
	}
	a.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1})
	if got, err := readFor(d, 200*time.Millisecond); err != nil || len(got) != 0 {
		t.Errorf("the blackhole delivered %d frames (%v)", len(got), err)
	}
}

func TestDelayHoldsFramesBackInOrder(t *testing.T) {
	const delay = 50 * time.Millisecond
	d, a := faultyDial(t, map[string]any{"delay": "50ms", "delay_jitter": "50ms"})
	start := time.Now()
	sendRequests(t, d, 50)
	if took := time.Since(start); took > delay {
		t.Errorf("writing delayed frames took %s; WriteFrame must not wait", took)
	}
	got, err := readUpTo(a, 50, quiet)
	if err != nil || len(got) != 50 {
		t.Fatalf("%d of 50 frames arrived (%v)", len(got), err)
	}
	if !slices.IsSorted(ids(got)) {
		t.Errorf("delayed frames arrived out of order: %v", ids(got))
	}
	if first := time.Since(start); first < delay {
		t.Errorf("all frames arrived within %s of a %s delay", first, delay)
	}
}

// Faults hit only the listed frame types, on the named side.
func TestFramesAndSideChooseWhatIsHit(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"drop": 1, "frames": []any{"response"}})
	sendRequests(t, d, 20)
	if got, _ := readUpTo(a, 20, quiet); len(got) != 20 {
		t.Errorf("%d of 20 requests arrived; drop of responses must leave them alone", len(got))
	}
	d, a = faultyDial(t, map[string]any{"drop": 1, "side": "listen"})
	sendRequests(t, d, 20)
	if got, _ := readUpTo(a, 20, quiet); len(got) != 20 {
		t.Errorf("%d of 20 requests arrived; faults on the listening side must leave the dialling side's writes alone", len(got))
	}
	sendRequests(t, a, 20)
	if got, _ := readFor(d, 200*time.Millisecond); len(got) != 0 {
		t.Errorf("%d frames of the listening side arrived with drop 1 there", len(got))
	}
}

func differing(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// A frame written after CloseWrite fails, as on the wrapped connection,
// whether the frames before it are still held back by a delay or already
// sent: accepted, it would reach the peer after the half-close promised
// that none would come, or be lost with its writer told it was sent.
func TestWritesAfterCloseWriteFailWhileFramesAreDelayed(t *testing.T) {
	for _, held := range []bool{true, false} {
		name := "nothing held"
		if held {
			name = "a frame held"
		}
		t.Run(name, func(t *testing.T) {
			d, a := faultyDial(t, map[string]any{"delay": "20ms"})
			want := []uint64(nil)
			if held {
				if err := sendRequests(t, d, 1)[0]; err != nil {
					t.Fatal(err)
				}
				want = []uint64{1}
			}
			if err := d.(kernel.HalfCloser).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			p := append(d.Buffer(64), payloadOf(2)...)
			if err := d.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: p}); !errors.Is(err, kernel.ErrClosed) {
				t.Errorf("WriteFrame after CloseWrite: %v; want an error wrapping ErrClosed", err)
			}
			got, err := readFor(a, 5*time.Second)
			if err == nil {
				t.Fatalf("the peer read %v and no end after CloseWrite", ids(got))
			}
			if !slices.Equal(ids(got), want) {
				t.Errorf("the peer read frames %v, then %v; want %v, then the end", ids(got), err, want)
			}
		})
	}
}

// A write after Close or CloseWrite fails wrapping ErrClosed, as the
// package doc and kernel.Conn promise, even with a reset due: the frame is
// not written, so no fault acts on it. Drawn as a reset, it killed the
// connection, read half included, and was reported (and Err with it) as
// an injected reset wrapping ErrPeerGone.
func TestWritesAfterCloseAreNotResets(t *testing.T) {
	d, a := faultyDial(t, map[string]any{"reset": 1})
	if err := d.(kernel.HalfCloser).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	p := append(d.Buffer(64), payloadOf(1)...)
	if err := d.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Payload: p}); !errors.Is(err, kernel.ErrClosed) || errors.Is(err, kernel.ErrPeerGone) {
		t.Errorf("WriteFrame after CloseWrite with reset 1: %v; want an error wrapping ErrClosed", err)
	}
	if err := a.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if back, err := readUpTo(d, 1, quiet); err != nil || len(back) != 1 {
		t.Errorf("after CloseWrite and a refused write, the connection read %d frames (%v); its read half must live on", len(back), err)
	}

	d, _ = faultyDial(t, map[string]any{"reset": 1})
	d.Close()
	p = append(d.Buffer(64), payloadOf(2)...)
	if err := d.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: p}); !errors.Is(err, kernel.ErrClosed) || errors.Is(err, kernel.ErrPeerGone) {
		t.Errorf("WriteFrame after Close with reset 1: %v; want an error wrapping ErrClosed", err)
	}
	if err := d.Err(); strings.Contains(fmt.Sprint(err), "injected") {
		t.Errorf("Err after Close is %v; no fault ended the connection", err)
	}
}
