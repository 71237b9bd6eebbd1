//go:build linux

package shmring

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kernrpc/kernrpc/kernel"
)

// rawConn is the server end of a connection whose client is the test
// itself: it writes the client's side of the segment and socket directly,
// as a malicious peer would.
type rawConn struct {
	c    *conn
	seg  *segment
	peer *os.File // the client's end of the liveness socket
}

func newRawConn(tb testing.TB, tr *transport) *rawConn {
	tb.Helper()
	seg, fd, err := createSegment(tr.ringSize, 0, 0)
	if err != nil {
		tb.Fatal(err)
	}
	unix.Close(fd)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "server end")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	c := newConn(tr, nc.(*net.UnixConn), seg, true, "fuzz", "fuzz peer")
	return &rawConn{c: c, seg: seg, peer: os.NewFile(uintptr(fds[1]), "client end")}
}

func (r *rawConn) close() {
	r.peer.Close()
	r.c.Close()
}

// FuzzSharedMemory lets a peer write anything into the ring and control
// words the server reads (records, head) and into those its writer reads
// (tail, held table). The server must return frames or a clean error,
// never panic, hang, or hand out a transport-level frame, and its own
// writes must fail cleanly or succeed.
func FuzzSharedMemory(f *testing.F) {
	req := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Echo.Echo", Codec: "protobuf", Timeout: time.Second, Metadata: kernel.Metadata{"k": "v"}, Payload: []byte("hello")}))
	ping := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FramePing, CallID: 2}))
	big := encodeFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 3, Payload: pattern(3000, 1)})
	chunks := append(rawRecord(kindFirstChunk, big[:1000]), rawRecord(kindChunk, big[1000:])...)
	pad := rawWord(kindPad)
	// A record, a wrap marker to the ring's end, and the same record again
	// at its start.
	wrapped := make([]byte, minRingSize)
	copy(wrapped, req)
	putWord(wrapped, uint64(len(req)), uint32(minRingSize-len(req)), kindWrap)
	for _, seed := range []struct {
		data             []byte
		head, tail, held uint64
	}{
		{req, uint64(len(req)), 0, 0},
		{append(append(append(pad, ping...), req...), chunks...), uint64(len(pad) + len(ping) + len(req) + len(chunks)), 0, 0},
		{append(rawRecord(kindFirstChunk, big[:1000]), rawWord(kindAbort)...), 1024 + 8, 0, 0},
		{wrapped, minRingSize + uint64(len(req)), 0, 0},
		{req, 1 << 20, 0, 0},
		{append(req, rawWord(kindEnd)...), uint64(len(req) + 8), 0, 0},
		{[]byte{0xff, 0xff, 0xff, 0xff, kindFrame, 0, 0, 0}, 8, 0, 0},
		{req, uint64(len(req)), 1 << 40, 0},
		{req, uint64(len(req)), 0, 1},
		{req, uint64(len(req)), 0, 2<<48 | 936<<32 | 936},
		{req, uint64(len(req)), 1000, 1<<48 | 932<<32 | 936},
		{nil, 0, 0, 0},
	} {
		f.Add(seed.data, seed.head, seed.tail, seed.held)
	}
	o := testOptions()
	o.RingSize = minRingSize
	o.MaxFrameSize = 64 << 10
	o.WaitTimeout = kernel.Duration(time.Millisecond)
	o.Spin = 0
	tr := newTransport(f, o)

	f.Fuzz(func(t *testing.T, data []byte, head, tail, held uint64) {
		r := newRawConn(t, tr)
		defer r.close()
		in := r.seg.ring(clientToServer)
		out := r.seg.ring(serverToClient)
		copy(in.data, data)
		in.head.Store(head)
		// The writer fills the ring; then the reader's side of it, a tail
		// and a held table made of the same bytes, lets it go on. Stored
		// before anything was written, a tail past head would be refused
		// at once, and held entries all lie past the tail, unread.
		released := false
		for i := range 40 {
			err := r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: uint64(i), Payload: append(r.c.Buffer(900), pattern(900, 1)...)})
			if kernel.CodeOf(err) == kernel.ResourceExhausted && !released {
				released = true
				releaseWithHeld(out, tail, held)
				continue
			}
			if err != nil {
				if !errors.Is(err, kernel.ErrMalformedFrame) && !errors.Is(err, kernel.ErrClosed) && kernel.CodeOf(err) != kernel.ResourceExhausted {
					t.Fatalf("WriteFrame: unexpected error %v", err)
				}
				break
			}
		}
		r.peer.Close() // the peer is gone: what it published is read, then the end
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range 1000 {
			fr, err := r.c.ReadFrame(ctx)
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("ReadFrame hung on %d bytes published", head)
				}
				if !errors.Is(err, kernel.ErrPeerGone) && !errors.Is(err, kernel.ErrMalformedFrame) &&
					!errors.Is(err, kernel.ErrFrameTooLarge) && !errors.Is(err, kernel.ErrClosed) {
					t.Fatalf("ReadFrame: unexpected error %v", err)
				}
				return
			}
			if fr.Type == kernel.FramePing || fr.Type == kernel.FramePong {
				t.Fatalf("ReadFrame returned a %v frame", fr.Type)
			}
			fr.Release()
		}
		t.Fatal("a ring of 16KiB yielded 1000 frames")
	})
}

// encodeFrame returns f as a record carries it.
func encodeFrame(f *kernel.Frame) []byte {
	return append(kernel.AppendFrameHeader(nil, f), f.Payload...)
}

// rawRecord returns a record of kind carrying content, padded to 8 bytes.
func rawRecord(kind uint8, content []byte) []byte {
	b := make([]byte, align8(recordHeaderLen+len(content)))
	putWord(b, 0, uint32(len(b)), kind)
	putContent(b, 0, recordHeaderLen, len(content))
	copy(b[recordHeaderLen:], content)
	return b
}

// TestRecordsAsDocumentedAreRead writes records byte by byte as
// docs/protocol.md describes them, not with this package's writer.
func TestRecordsAsDocumentedAreRead(t *testing.T) {
	r := newRawConn(t, newTransport(t, testOptions()))
	defer r.close()
	req := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "Echo.Echo", Payload: []byte("hello")}
	big := &kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: pattern(3000, 1)}
	bigBytes := encodeFrame(big)
	var data []byte
	data = append(data, rawWord(kindPad)...)
	data = append(data, rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FramePing, CallID: 9}))...)
	data = append(data, rawRecord(kindFrame, encodeFrame(req))...)
	data = append(data, rawRecord(kindFirstChunk, bigBytes[:1000])...)
	data = append(data, rawRecord(kindChunk, bigBytes[1000:2000])...)
	data = append(data, rawRecord(kindChunk, bigBytes[2000:])...)
	data = append(data, rawWord(kindEnd)...)
	in := r.seg.ring(clientToServer)
	copy(in.data, data)
	in.head.Store(uint64(len(data)))
	for _, want := range []*kernel.Frame{req, big} {
		f := recv(t, r.c)
		if f.Type != want.Type || f.CallID != want.CallID || f.Method != want.Method || string(f.Payload) != string(want.Payload) {
			t.Fatalf("read call %d (%v, %q, %d bytes), want call %d", f.CallID, f.Type, f.Method, len(f.Payload), want.CallID)
		}
		f.Release()
	}
	if got, want := in.tail.Load(), uint64(len(data)-wordLen); got != want {
		t.Fatalf("tail %d after reading and releasing every frame, want %d", got, want)
	}
	// The end record ends the connection (and unmaps the segment).
	if _, err := r.c.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("after the end record: %v", err)
	}
}

// rawWord returns a record that is a word alone.
func rawWord(kind uint8) []byte {
	b := make([]byte, wordLen)
	putWord(b, 0, wordLen, kind)
	return b
}

// releaseWithHeld plays the reader of a full ring: it moves the tail back
// from head by tail (mod head+1) and lists held (bits 48-49) entries, each
// a record of held's bits 32-47 bytes, back to back from the position in
// its low 32 bits (mod head+1).
func releaseWithHeld(out ringView, tail, held uint64) {
	h := out.head.Load()
	out.tail.Store(h - tail%(h+1))
	n := int(held >> 48 % 4)
	start, length := uint64(uint32(held))%(h+1), held>>32&0xffff
	for j := range n {
		out.held[j][0].Store(start + uint64(j)*length)
		out.held[j][1].Store(start + uint64(j+1)*length)
	}
	out.nheld.Store(uint32(n))
}
