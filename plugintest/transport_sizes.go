package plugintest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportLargeOffsets are the frame lengths, relative to
// TransportConfig.LargeFrame, that Frames/Sizes sends: both sides of the
// threshold and of the 8-byte alignment a ring's records have around it,
// and every 32 bytes for 256 bytes below it, where the record overheads
// of a ring (shm-ring lends buffers 256 bytes into a record) put nearby
// thresholds.
var transportLargeOffsets = []int{-256, -224, -192, -160, -128, -96, -64, -32, -24, -17, -16, -9, -8, -1, 0, 1, 7, 8, 9, 16, 24}

// transportOneWay is the frame length above which Frames/Sizes and
// Frames/Widths send a frame one way only, alternating directions, to keep
// the suite quick: both directions have crossed every smaller boundary.
const transportOneWay = 64 << 10

// transportLargeMargin is how far above LargeFrame the suite's frames go.
const transportLargeMargin = 64

// transportSampleOfLength is the suite's sample frame for call callID's
// seq-th, its payload sized so that the frame's length field is n (a
// negative payload is cut to 0).
func transportSampleOfLength(callID uint64, seq, n int) *kernel.Frame {
	f := transportSample(nil, callID, seq, 0)
	return transportSample(nil, callID, seq, max(0, n-transportBodyLen(f)))
}

// transportBodyLen is what f's length field counts without its payload:
// the fixed part and the fields.
func transportBodyLen(f *kernel.Frame) int {
	return kernel.FrameHeaderLen(f) - kernel.FramePrefixLen
}

// frameSizes sends frames whose lengths lie on both sides of every
// boundary an encoding, a buffer or a ring may have: small payloads at
// every 8-byte alignment, lengths around each power of two from 128 bytes
// on (the length field alone and with its 4-byte prefix), around
// cfg.LargeFrame, and at the maximum.
func (e *transportEnv) frameSizes(t tb) {
	hl := transportBodyLen(transportSample(nil, 1, 0, 0))
	var lengths []int
	for n := range 18 {
		lengths = append(lengths, hl+n)
	}
	for k := 7; k < 32 && 1<<k-5 <= e.max; k++ {
		offsets := []int{-5, -4, -3, -1, 0, 1}
		if k > 16 {
			offsets = []int{0, 1} // fewer, larger frames
		}
		for _, d := range offsets {
			lengths = append(lengths, 1<<k+d)
		}
	}
	if L := e.cfg.LargeFrame; L > 0 {
		for _, d := range transportLargeOffsets {
			lengths = append(lengths, L+d)
		}
	}
	lengths = append(lengths, e.max-1) // e.max: Frames/Max
	slices.Sort(lengths)
	lengths = slices.Compact(lengths)

	p := e.pair(t)
	for i, n := range lengths {
		for j, dir := range []struct {
			name     string
			from, to kernel.Conn
		}{{"client→server", p.client, p.server}, {"server→client", p.server, p.client}} {
			if n > transportOneWay && (i+j)%2 == 1 {
				continue // large frames go one way each, alternately
			}
			want := transportSampleOfLength(uint64(2*i+j+1), i, n)
			if transportBodyLen(want)+len(want.Payload) != n || n >= e.max {
				continue // shorter than the sample's header, or too long
			}
			got := e.transfer(t, dir.from, dir.to, want)
			d := transportDiff(got, want)
			got.Release()
			if d != "" {
				t.Fatalf("%s frame of length %d (%d-byte payload) arrived changed: %s; frames of every length up to the maximum %d must cross intact%s",
					dir.name, n, len(want.Payload), d, e.max, e.largeNote(n))
			}
		}
	}
}

// largeNote says where n lies relative to cfg.LargeFrame, for messages.
func (e *transportEnv) largeNote(n int) string {
	if e.cfg.LargeFrame <= 0 {
		return ""
	}
	d := strconv.Itoa(n - e.cfg.LargeFrame)
	if n >= e.cfg.LargeFrame {
		d = "+" + d
	}
	return " (a frame of length LargeFrame" + d + ", LargeFrame being " + strconv.Itoa(e.cfg.LargeFrame) + ")"
}

// transportLargeHeader is a frame whose fields take at least n bytes,
// mostly metadata entries of values of at least 200 bytes, long enough
// that the entries stay within half of lim's count.
func transportLargeHeader(callID uint64, n int, lim kernel.FrameLimits) *kernel.Frame {
	f := transportSample(nil, callID, 0, 0)
	f.Metadata = kernel.Metadata{"seq": "0"}
	value := string(transportPrintable(callID, max(200, 2*n/max(1, lim.MaxMetadataEntries))))
	for i := 0; transportBodyLen(f) < n; i++ {
		f.Metadata["k"+strconv.Itoa(i)] = value
	}
	return f
}

// transportLargeHeaderLen is how many header bytes the large-header
// checks use: half the maximum, at most 64KiB, and with metadata within
// the limits.
func (e *transportEnv) transportLargeHeaderLen() int {
	return min(e.max/2, 64<<10, e.mdLimits.MaxMetadataBytes*9/10)
}

// maxLargeHeader sends a frame of exactly the maximum length whose header
// is half of it: the header counts toward the maximum, and must be
// counted right.
func (e *transportEnv) maxLargeHeader(t tb) {
	p := e.pair(t)
	for i, dir := range []struct {
		name     string
		from, to kernel.Conn
	}{{"client→server", p.client, p.server}, {"server→client", p.server, p.client}} {
		want := transportLargeHeader(uint64(i+1), e.transportLargeHeaderLen(), e.mdLimits)
		want.Payload = transportFill(nil, 11, e.max-transportBodyLen(want))
		got := e.transfer(t, dir.from, dir.to, want)
		d := transportDiff(got, want)
		got.Release()
		if d != "" {
			t.Errorf("%s frame of exactly the maximum length %d, %d bytes of it header (%d metadata entries), arrived changed: %s",
				dir.name, e.max, transportBodyLen(want), len(want.Metadata), d)
		}
	}
}

// tooLarge sends frames one byte over the maximum and checks that each is
// refused cleanly and that only its connection may suffer.
func (e *transportEnv) tooLarge(t tb) {
	tr := e.transport(t)
	l := e.listen(t, tr)
	bystanderClient, bystanderServer := e.connect(t, tr, l)
	t.Run("Refused", func(t tb) {
		client, server := e.connect(t, tr, l)
		e.refused(t, client, server, transportSample(nil, 9, 0, 0), "client→server")
	})
	t.Run("RefusedFromServer", func(t tb) {
		client, server := e.connect(t, tr, l)
		e.refused(t, server, client, transportSample(nil, 9, 0, 0), "server→client")
	})
	t.Run("LargeHeader", func(t tb) {
		client, server := e.connect(t, tr, l)
		e.refused(t, client, server, transportLargeHeader(9, e.transportLargeHeaderLen(), e.mdLimits), "client→server, with a large header,")
	})
	t.Run("OtherConnsWork", func(t tb) {
		e.exchange(t, bystanderClient, bystanderServer, 1, 1<<10)
		e.exchange(t, bystanderServer, bystanderClient, 2, 1<<10)
	})
}

// refused writes header with a payload that makes it one byte over the
// maximum on from, and checks the outcome as refusal does.
func (e *transportEnv) refused(t tb, from, to kernel.Conn, header *kernel.Frame, what string) {
	t.Helper()
	f := transportHeader(header)
	n := e.max - transportBodyLen(f) + 1
	f.Payload = transportFill(from.Buffer(n), 9, n)
	e.refusal(t, from, to, f, what, kernel.ErrFrameTooLarge, "over the maximum frame size "+strconv.Itoa(e.max))
}

// refusal writes f, which breaks a limit (over says which), on from, and
// checks the outcome against the kernel's contract (kernel.Conn.WriteFrame):
// refused by WriteFrame with an error wrapping sentinel, either as a
// *kernel.Status, after which the connection carries the next frames both
// ways, or with any other error, after which the connection is dead; or
// written and then refused by the receiver, which closes the connection.
// Never delivered.
func (e *transportEnv) refusal(t tb, from, to kernel.Conn, f *kernel.Frame, what string, sentinel error, over string) {
	t.Helper()
	written := make(chan error, 1)
	transportGo(t, func() { written <- from.WriteFrame(f) })
	// Read meanwhile: a transport that leaves the check to the receiver
	// may write the frame only as the receiver reads it.
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	read := make(chan transportReadResult, 1)
	transportGo(t, func() {
		f, err := transportRead(ctx, to)
		read <- transportReadResult{f, err}
	})
	var werr error
	select {
	case werr = <-written:
	case <-time.After(2 * e.patience):
		t.Fatalf("WriteFrame (%s) of a frame %s did not return within %s", what, over, 2*e.patience)
	}
	if errors.Is(werr, sentinel) {
		var st *kernel.Status
		if !errors.As(werr, &st) {
			// Not a *Status: the kernel takes the connection for dead.
			if !transportWaitDone(from, e.patience) {
				t.Errorf("WriteFrame (%s) refused a frame %s with %q, which is not a *kernel.Status, yet the connection stayed alive (Done still open after %s): "+
					"the kernel takes any other error to mean the connection is dead and fails every call on it (kernel.Conn.WriteFrame). "+
					"Refuse the frame alone with a *kernel.Status (ResourceExhausted) that also wraps %v, or close the connection",
					what, over, werr, e.patience, sentinel)
			} else if from.Err() == nil {
				t.Errorf("WriteFrame (%s) refused a frame %s and Done closed, but Err is nil; Err must say why the connection died", what, over)
			}
			return
		}
		// Refused alone: the connection must go on as if it had never
		// been written. The pending read takes the next frame.
		if err := from.Err(); err != nil {
			t.Fatalf("WriteFrame (%s) refused a frame %s with a *kernel.Status (%v), which says that frame alone was refused, but the connection is dead (Err: %v)", what, over, werr, err)
		}
		want := transportSample(nil, 10, 1, 1<<10)
		next := transportHeader(want)
		next.Payload = append(from.Buffer(len(want.Payload)), want.Payload...)
		if err := from.WriteFrame(next); err != nil {
			t.Fatalf("after WriteFrame (%s) refused a frame %s with a *kernel.Status, the next WriteFrame failed: %v; a *kernel.Status means the connection stays usable", what, over, err)
		}
		var r transportReadResult
		select {
		case r = <-read:
		case <-time.After(2 * e.patience):
			t.Fatalf("ReadFrame ignored its context: still blocked %s after the deadline", e.patience)
		}
		switch {
		case r.err != nil:
			t.Fatalf("after WriteFrame (%s) refused a frame %s with a *kernel.Status, the frame written next did not arrive (ReadFrame: %v); "+
				"nothing of a refused frame may be sent, and the connection must stay usable", what, over, r.err)
		case transportDiff(r.f, want) != "":
			d := transportDiff(r.f, want)
			r.f.Release()
			t.Fatalf("after WriteFrame (%s) refused a frame %s with a *kernel.Status, the next frame to arrive was not the one written next: %s; "+
				"nothing of a refused frame may be sent", what, over, d)
		}
		r.f.Release()
		e.exchange(t, to, from, 11, 1<<10)
		return
	}
	var r transportReadResult
	select {
	case r = <-read:
	case <-time.After(2 * e.patience):
		t.Fatalf("ReadFrame ignored its context: still blocked %s after the deadline", e.patience)
	}
	switch {
	case r.err == nil:
		r.f.Release()
		t.Errorf("a frame (%s) %s was delivered (%d-byte payload, %d bytes of header, %d metadata entries); it must be refused by WriteFrame or by the receiver",
			what, over, len(f.Payload), transportBodyLen(f), len(f.Metadata))
	case ctx.Err() != nil && werr != nil:
		t.Errorf("WriteFrame (%s) of a frame %s: %v; want an error wrapping %v", what, over, werr, sentinel)
	case ctx.Err() != nil:
		t.Errorf("a frame (%s) %s was accepted by WriteFrame and then vanished: the receiver neither delivered it nor closed the connection within %s; refuse it with an error wrapping %v instead", what, over, e.patience, sentinel)
	case !transportWaitDone(to, e.patience):
		t.Errorf("the receiver's ReadFrame failed on a frame (%s) %s (%v), but its Done did not close", what, over, r.err)
	}
}

// transportPrintable returns n printable ASCII bytes derived from seed,
// so that a string cut short or shifted is told apart: transportFill's
// blocks, mapped to letters once per block.
func transportPrintable(seed uint64, n int) []byte {
	block := transportBlockOf(seed)
	for i := range block {
		block[i] = 'a' + block[i]%26
	}
	out := make([]byte, n)
	for off := 0; off < n; off += transportBlock {
		k := copy(out[off:], block)
		// The block's index, in letters, at its start.
		for j, x := 0, off/transportBlock; j < min(4, k); j, x = j+1, x/26 {
			out[off+j] = 'A' + byte(x%26)
		}
	}
	return out
}

// transportRepeat is s repeated until it is about n bytes long, cut
// where a character ends, so that it stays UTF-8.
func transportRepeat(s string, n int) string {
	if n <= 0 {
		return ""
	}
	r := strings.Repeat(s, n/len(s)+1)[:n]
	for !utf8.ValidString(r) {
		r = r[:len(r)-1]
	}
	return r
}
