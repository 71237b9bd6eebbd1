package tcplv

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Each test here fails when the limit it names is taken out of the
// transport; docs/reliability.md lists them.

// readUntilDead reads on c until ReadFrame fails, which must happen
// within within, and returns the error.
func readUntilDead(t *testing.T, c *conn, within time.Duration) error {
	t.Helper()
	ctx := timeout(t, within)
	for {
		f, err := c.ReadFrame(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("the connection is still alive after %s", within)
			}
			return err
		}
		f.Release()
	}
}

func wantDeath(t *testing.T, err error, sentinel error, contains string) {
	t.Helper()
	if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), contains) {
		t.Fatalf("the connection died of %q; want an error wrapping %v that names %q", err, sentinel, contains)
	}
}

func TestMetadataOverTheLimitReadClosesTheConnection(t *testing.T) {
	o := testOptions()
	o.MaxMetadataEntries = 4
	raw, server := rawPair(t, o)
	md := kernel.Metadata{}
	for i := range 5 {
		md["k"+strconv.Itoa(i)] = "v"
	}
	raw.Write(encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Metadata: md}))
	wantDeath(t, readUntilDead(t, server, 5*time.Second), kernel.ErrMetadataTooLarge, "more than 4 metadata entries")
}

func TestMetadataOverTheLimitWrittenIsRefusedAloneWithResourceExhausted(t *testing.T) {
	o := testOptions()
	o.MaxMetadataBytes = 100
	client, server := connPair(t, o)
	err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Metadata: kernel.Metadata{"k": strings.Repeat("v", 100)}})
	if kernel.CodeOf(err) != kernel.ResourceExhausted || !errors.Is(err, kernel.ErrMetadataTooLarge) || !strings.Contains(err.Error(), "max_metadata_bytes 100") {
		t.Fatalf("WriteFrame with 101 bytes of metadata: %v; want ResourceExhausted naming max_metadata_bytes", err)
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil || f.CallID != 2 {
		t.Fatalf("the next frame: %v, %v; want call 2 (nothing of the refused one)", f, err)
	}
	f.Release()
}

// A peer announcing the largest frame and sending a few bytes of it gets
// a buffer sized by what arrived, not by what it announced.
func TestAnnouncedLengthReservesNoMemoryBeforeTheBytesArrive(t *testing.T) {
	raw, server := rawPair(t, testOptions())
	prefix := []byte{0, 0x40, 0, 0} // 4 MiB
	raw.Write(append(prefix, encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1})[4:]...))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if f, err := server.ReadFrame(ctx); err == nil {
		f.Release()
		t.Fatal("a frame arrived from a peer that sent 16 bytes of 4 MiB")
	}
	if c := cap(server.body); c == 0 || c > 128<<10 {
		t.Fatalf("the frame being read holds a buffer of %d bytes; want it bounded by what arrived (at most 128KiB), not the 4MiB announced", c)
	}
	// The rest arriving makes the frame whole, intact.
	payload := pattern(4<<20-kernel.FrameFixedLen, 3)
	go raw.Write(payload)
	f, err := server.ReadFrame(timeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if string(f.Payload) != string(payload) {
		t.Fatal("the 4 MiB frame that arrived in pieces is not the one sent")
	}
}

func TestStalledFrameIsCutOffAfterFrameTimeout(t *testing.T) {
	for _, trickle := range []bool{false, true} {
		t.Run(map[bool]string{false: "stops", true: "trickles"}[trickle], func(t *testing.T) {
			o := testOptions()
			o.FrameTimeout = kernel.Duration(300 * time.Millisecond)
			raw, server := rawPair(t, o)
			// The first frame is held to first_frame_timeout; send one.
			raw.Write(encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: 1}))
			wire := encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: make([]byte, 1000)})
			raw.Write(wire[:10])
			if trickle {
				go func() {
					for _, b := range wire[10:] {
						if _, err := raw.Write([]byte{b}); err != nil {
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}()
			}
			start := time.Now()
			wantDeath(t, readUntilDead(t, server, 5*time.Second), kernel.ErrClosed, "frame_timeout")
			if took := time.Since(start); took < 250*time.Millisecond {
				t.Fatalf("cut off after %s, before frame_timeout", took)
			}
		})
	}
}

// A slow frame is not a stalled one: frames that take less than
// frame_timeout each, one after another, keep the connection.
func TestFramesWithinFrameTimeoutKeepTheConnection(t *testing.T) {
	o := testOptions()
	o.FrameTimeout = kernel.Duration(300 * time.Millisecond)
	raw, server := rawPair(t, o)
	go func() {
		for i := range 6 {
			wire := encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: uint64(i + 1)})
			raw.Write(wire[:5])
			time.Sleep(150 * time.Millisecond)
			raw.Write(wire[5:])
		}
	}()
	for i := range 6 {
		f, err := server.ReadFrame(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatalf("frame %d: %v; frames that each arrived within frame_timeout must not kill the connection", i+1, err)
		}
		f.Release()
	}
}

func TestSilentAcceptedConnectionIsCutOffAfterFirstFrameTimeout(t *testing.T) {
	o := testOptions()
	o.FirstFrameTimeout = kernel.Duration(300 * time.Millisecond)
	raw, server := rawPair(t, o)
	wantDeath(t, readUntilDead(t, server, 5*time.Second), kernel.ErrClosed, "first_frame_timeout")
	// It served no call, and says so: a client's call on its way is
	// sent again elsewhere.
	wantGoAway(t, raw, "first_frame_timeout", 0)

	// A connection whose first frame came in time is not held to it.
	raw, server = rawPair(t, o)
	raw.Write(encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: 1}))
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, err := server.ReadFrame(ctx); ctx.Err() == nil {
		t.Fatalf("an idle connection that sent its first frame in time died: %v", err)
	}
}

// A peer that stops reading is cut off once max_write_queue bytes wait
// for it, instead of the sender buffering without bound.
func TestPeerThatDoesNotReadIsCutOffAtMaxWriteQueue(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	o.MaxWriteQueue = 256 << 10
	raw, server := rawPair(t, o)
	_ = raw // never read
	payload := make([]byte, 32<<10)
	var err error
	sent := 0
	for sent = 0; sent < 64<<20; sent += len(payload) {
		buf := append(server.Buffer(len(payload)), payload...)
		if err = server.QueueFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: buf}); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatalf("queued %d MiB for a peer that reads nothing without an error", sent>>20)
	}
	wantDeath(t, err, kernel.ErrPeerGone, "max_write_queue")
	if server.Err() == nil {
		t.Fatal("the connection is still alive")
	}
}

// A peer that stops draining its socket kills the connection after
// write_timeout, and not before: the write deadline is moved only once
// less than write_timeout is left, to 1.5 × write_timeout away.
func TestPeerThatDoesNotDrainIsCutOffAfterWriteTimeout(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	o.MaxWriteQueue = 1 << 30 // the write timeout, not the queue, must end it
	o.WriteTimeout = kernel.Duration(400 * time.Millisecond)
	raw, server := rawPair(t, o)
	_ = raw // never read
	payload := make([]byte, 32<<10)
	start := time.Now()
	// Loopback sockets buffer some MiB; 64 MiB fill them whatever the
	// host's settings, and the writer then blocks on a write.
	for sent := 0; sent < 64<<20; sent += len(payload) {
		buf := append(server.Buffer(len(payload)), payload...)
		if err := server.QueueFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: buf}); err != nil {
			break
		}
	}
	err := readUntilDead(t, server, 10*time.Second)
	wantDeath(t, err, kernel.ErrPeerGone, "did not drain its socket for 400ms")
	if took := time.Since(start); took < o.WriteTimeout.D() {
		t.Fatalf("the connection died %s after the peer stopped reading, before write_timeout (%s)", took, o.WriteTimeout.D())
	}
}

func TestPingWithALargePayloadClosesTheConnection(t *testing.T) {
	raw, server := rawPair(t, testOptions())
	raw.Write(encode(&kernel.Frame{Type: kernel.FramePing, Payload: make([]byte, kernel.MaxPingPayload+1)}))
	wantDeath(t, readUntilDead(t, server, 5*time.Second), kernel.ErrMalformedFrame, "Ping payload of 65 bytes")
}

// Pings closer together than min_ping_interval, with nothing between,
// get a GoAway saying too_many_pings and then the connection closed.
func TestTooManyPingsGetAGoAwayAndTheConnectionClosed(t *testing.T) {
	o := testOptions()
	o.MinPingInterval = kernel.Duration(time.Second)
	raw, server := rawPair(t, o)
	go readUntilDeadQuietly(server)
	ping := encode(&kernel.Frame{Type: kernel.FramePing})
	for range maxPingStrikes + 2 {
		raw.Write(ping)
	}
	wantGoAway(t, raw, "too_many_pings", kernel.GoAwayUnknownLast)
}

// wantGoAway reads raw's frames, Pongs aside, until a GoAway giving reason
// and naming last as the last call served, which must be followed by EOF.
func wantGoAway(t *testing.T, raw net.Conn, reason string, last uint64) {
	t.Helper()
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(raw)
	for {
		f, err := readRawFrame(br)
		if err != nil {
			t.Fatalf("the connection closed without a GoAway: %v", err)
		}
		if f.Type == kernel.FramePong {
			continue
		}
		if f.Type != kernel.FrameGoAway || f.Message != reason || f.CallID != last {
			t.Fatalf("got %v %q (call id %d); want a GoAway saying %s with last call %d", f.Type, f.Message, f.CallID, reason, last)
		}
		break
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the GoAway: %v; want EOF", err)
	}
}

// The reader and first_frame_timeout's clock each claim an accepted
// connection's first frame. A frame that arrives whole once the clock has
// claimed it is never returned: the clock's GoAway tells the peer that no
// call was served, and the peer sends its calls again.
func TestAFirstFrameTheClockClaimedIsNotServed(t *testing.T) {
	o := testOptions()
	o.FirstFrameTimeout = kernel.Duration(time.Hour)
	raw, server := rawPair(t, o)
	// Where frameExpired stands once it has claimed the frame and not yet
	// said GoAway.
	if !server.clockFirst.CompareAndSwap(firstAwaited, firstLate) {
		t.Fatal("an accepted connection does not await its first frame")
	}
	type read struct {
		f   *kernel.Frame
		err error
	}
	got := make(chan read, 1)
	go func() {
		f, err := server.ReadFrame(timeout(t, 5*time.Second))
		got <- read{f, err}
	}()
	raw.Write(encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Echo"}))
	select {
	case r := <-got:
		t.Fatalf("ReadFrame returned (%v, %v) before the clock said GoAway; want it to wait, then fail", r.f, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	server.goAwayAndFail(slog.LevelInfo, 0, "first_frame_timeout", errors.New("test: first_frame_timeout ran out"))
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("ReadFrame returned the %v the clock claimed; it would run, and run again when resent", r.f.Type)
		}
		if !strings.Contains(r.err.Error(), "first_frame_timeout") {
			t.Errorf("ReadFrame failed with %v; want the clock's reason", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadFrame did not return after the connection failed")
	}
	wantGoAway(t, raw, "first_frame_timeout", 0)
}

// Pings at the interval a peer's own keepalive uses are never held
// against it, and any other frame between two Pings forgives them.
func TestPingsAtTheKeepaliveIntervalAreAllowed(t *testing.T) {
	o := testOptions()
	o.MinPingInterval = kernel.Duration(100 * time.Millisecond)
	raw, server := rawPair(t, o)
	go readUntilDeadQuietly(server)
	for range 2 * maxPingStrikes {
		raw.Write(encode(&kernel.Frame{Type: kernel.FramePing}))
		time.Sleep(120 * time.Millisecond)
	}
	for i := range 4 * maxPingStrikes {
		raw.Write(encode(&kernel.Frame{Type: kernel.FramePing}))
		raw.Write(encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: uint64(i + 1)}))
	}
	time.Sleep(50 * time.Millisecond)
	if err := server.Err(); err != nil {
		t.Fatalf("the connection died: %v", err)
	}
}

func readUntilDeadQuietly(c *conn) {
	for {
		f, err := c.ReadFrame(context.Background())
		if err != nil {
			return
		}
		f.Release()
	}
}

// A peer that sends Pings (forgiven by frames between them) while the
// writer cannot send holds at most maxQueuedPongs answers in the queue:
// one answer is all a liveness probe needs, and more would grow the
// queue on the peer's say-so.
func TestQueuedPongsAreBounded(t *testing.T) {
	raw, server := rawPair(t, testOptions())
	// Holding the write lock stands for a socket the peer does not drain:
	// the writer goroutine cannot take the queue meanwhile.
	server.wmu.Lock()
	locked := true
	defer func() {
		if locked {
			server.wmu.Unlock()
		}
	}()
	const pings = 3 * maxQueuedPongs
	for i := range pings {
		raw.Write(encode(&kernel.Frame{Type: kernel.FramePing, Payload: []byte{byte(i)}}))
		raw.Write(encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: uint64(i + 1)}))
	}
	// The Cancels come out of ReadFrame; the Pings before them were
	// answered by then.
	for range pings {
		f, err := server.ReadFrame(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		f.Release()
	}
	server.qmu.Lock()
	queued := server.q.pongs
	server.qmu.Unlock()
	if queued != maxQueuedPongs {
		t.Errorf("%d Pongs queued for %d Pings; want at most %d", queued, pings, maxQueuedPongs)
	}
	server.wmu.Unlock()
	locked = false
	server.signalWriter()
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(raw)
	var got []byte
	for len(got) < maxQueuedPongs {
		f, err := readRawFrame(br)
		if err != nil {
			t.Fatalf("after %d Pongs: %v", len(got), err)
		}
		if f.Type == kernel.FramePong {
			got = append(got, f.Payload...)
		}
	}
	raw.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if f, err := readRawFrame(br); err == nil {
		t.Errorf("a %v frame followed the first %d Pongs; want nothing more", f.Type, maxQueuedPongs)
	}
	if got[0] != 0 || got[len(got)-1] != maxQueuedPongs-1 {
		t.Errorf("Pongs answering Pings %v; want the first %d, in order", got, maxQueuedPongs)
	}
	if err := server.Err(); err != nil {
		t.Errorf("the connection died: %v; dropping surplus Pongs is not a reason", err)
	}
}

// readRawFrame reads one frame off a plain socket, as a tcp-lv peer would.
func readRawFrame(br *bufio.Reader) (kernel.Frame, error) {
	var f kernel.Frame
	var prefix [kernel.FramePrefixLen]byte
	if _, err := io.ReadFull(br, prefix[:]); err != nil {
		return f, err
	}
	n, err := kernel.ReadFrameLength(prefix[:], 0)
	if err != nil {
		return f, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return f, err
	}
	return f, kernel.DecodeFrame(body, &f, nil)
}

// TestPingsTooCloseOnlyNowAndThenAreNotStrikesInARow: the doc and
// docs/reliability.md cut a peer off for Pings closer than
// min_ping_interval "more than twice in a row". A peer whose Pings are
// too close only every other time never has two in a row.
func TestPingsTooCloseOnlyNowAndThenAreNotStrikesInARow(t *testing.T) {
	o := testOptions()
	o.MinPingInterval = kernel.Duration(100 * time.Millisecond)
	raw, server := rawPair(t, o)
	go readUntilDeadQuietly(server)
	ping := encode(&kernel.Frame{Type: kernel.FramePing})
	raw.Write(ping)
	for range 2 * (maxPingStrikes + 1) {
		time.Sleep(10 * time.Millisecond) // too soon: a strike
		raw.Write(ping)
		// Well spaced, with room to spare: the server times Pings as it
		// reads them, so a reader stalled on a loaded machine could see
		// two sent apart as close together.
		time.Sleep(400 * time.Millisecond)
		raw.Write(ping)
	}
	time.Sleep(50 * time.Millisecond)
	if err := server.Err(); err != nil {
		t.Fatalf("the connection died, though no two Pings in a row came too close: %v", err)
	}
}

// A Ping that follows another frame is no strike, however soon after the
// Ping before that frame it comes: only Pings with no other frame between
// count, and it takes more than maxPingStrikes of those in a row to get
// the GoAway (docs/protocol.md). The frames go in one write and are read
// in order, so the outcome does not depend on timing.
func TestAFrameBetweenPingsForgivesTheNextPing(t *testing.T) {
	ping := encode(&kernel.Frame{Type: kernel.FramePing})
	cancel := encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: 1})
	last := encode(&kernel.Frame{Type: kernel.FrameCancel, CallID: 2})
	for _, tc := range []struct {
		name     string
		pingsAll int // Pings after the Cancel, all too soon
		wantDead bool
	}{
		{"as many Pings in a row as allowed", maxPingStrikes + 1, false},
		{"one Ping too many", maxPingStrikes + 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions()
			o.MinPingInterval = kernel.Duration(time.Hour)
			raw, server := rawPair(t, o)
			var wire []byte
			wire = append(wire, ping...)
			wire = append(wire, cancel...)
			for range tc.pingsAll {
				wire = append(wire, ping...)
			}
			wire = append(wire, last...)
			raw.Write(wire)
			for _, id := range []uint64{1, 2} {
				f, err := server.ReadFrame(timeout(t, 5*time.Second))
				if err != nil {
					if !tc.wantDead {
						t.Fatalf("the connection died at frame %d, though no more than %d Pings came too soon in a row: %v", id, maxPingStrikes, err)
					}
					return
				}
				if f.Type != kernel.FrameCancel || f.CallID != id {
					t.Fatalf("read %v %d, want Cancel %d", f.Type, f.CallID, id)
				}
				f.Release()
			}
			if tc.wantDead {
				t.Fatalf("%d Pings too soon in a row were let through", tc.pingsAll)
			}
		})
	}
}

// The frame clock of an accepted connection is set going only once its
// state is in place. Made running, a timer of a short first_frame_timeout
// could fire before newConn stored the deadline, find none and disarm
// itself for good: that silent connection was never cut off (and no frame
// of it ever timed). With the timeout far below what options allow, the
// timer fires at once, so many connections try the race.
func TestTheFirstFrameClockRunsEvenWhenItsTimerFiresAtOnce(t *testing.T) {
	tr := newTransport(t, testOptions())
	tr.firstFrameTimeout = time.Nanosecond
	const n = 2000
	conns := make([]*conn, 0, n)
	for range n {
		local, peer := net.Pipe()
		t.Cleanup(func() { peer.Close() })
		go io.Copy(io.Discard, peer) // takes the GoAway
		c := newConn(tr, local, local, true)
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	expired := make(chan struct{}) // only a hang takes this long
	time.AfterFunc(10*time.Second, func() { close(expired) })
	alive := 0
	for _, c := range conns {
		select {
		case <-c.Done():
		case <-expired:
			alive++
		}
	}
	if alive > 0 {
		t.Fatalf("%d of %d silent connections were never cut off by first_frame_timeout", alive, n)
	}
}
