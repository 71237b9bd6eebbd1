//go:build linux

package shmring

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// recordScript is a ring's worth of records built from a fuzzer's bytes:
// FuzzSharedMemory's raw bytes rarely form a valid chain of records, so
// this target builds valid ones (frames, chunked frames, pads, aborts,
// pings) and lets some script bytes corrupt the result.
type recordScript struct {
	ring      []byte
	want      []*kernel.Frame // the frames the reader must hand out, in order
	corrupted bool
}

// next takes n bytes of the script, zero once it runs out.
func next(script *[]byte, n int) int {
	v := 0
	for range n {
		v <<= 8
		if len(*script) > 0 {
			v |= int((*script)[0])
			*script = (*script)[1:]
		}
	}
	return v
}

func buildRecords(script []byte, ringSize int) *recordScript {
	s := &recordScript{}
	var flips [][2]int
	for id := uint64(1); len(script) > 0; id++ {
		var add []byte
		var want *kernel.Frame
		switch next(&script, 1) % 6 {
		case 0, 1: // a frame, whole or in pieces
			pieces := 1 + next(&script, 1)%4
			want = &kernel.Frame{Type: kernel.FrameRequest, CallID: id, Method: "Echo.Echo",
				Metadata: kernel.Metadata{"n": strconv.Itoa(int(id))}, Payload: pattern(next(&script, 2)%5000, byte(id))}
			frame := encodeFrame(want)
			if align8(recordHeaderLen+len(frame)) > ringSize/4 {
				pieces = max(pieces, 2) // no record is larger than a quarter ring
			}
			add = chunked(frame, pieces)
		case 2:
			add = rawWord(kindPad)
		case 3: // a chunked frame its writer gave up on
			big := encodeFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: id, Payload: pattern(2000, 3)})
			add = append(rawRecord(kindFirstChunk, big[:700]), rawWord(kindAbort)...)
		case 4: // liveness is the socket's: the reader drops pings
			add = rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FramePing, CallID: id}))
		case 5:
			flips = append(flips, [2]int{next(&script, 2), next(&script, 1) | 1})
		}
		if len(s.ring)+len(add) > ringSize {
			break
		}
		s.ring = append(s.ring, add...)
		if want != nil {
			s.want = append(s.want, want)
		}
	}
	for _, fl := range flips {
		if len(s.ring) > 0 {
			s.ring[fl[0]%len(s.ring)] ^= byte(fl[1])
			s.corrupted = true
		}
	}
	return s
}

// chunked returns frame as one record, or as a first chunk and pieces-1
// chunks.
func chunked(frame []byte, pieces int) []byte {
	if pieces == 1 {
		return rawRecord(kindFrame, frame)
	}
	step := (len(frame) + pieces - 1) / pieces
	var out []byte
	for i := 0; i < len(frame); i += step {
		kind := uint8(kindChunk)
		if i == 0 {
			kind = kindFirstChunk
		}
		out = append(out, rawRecord(kind, frame[i:min(i+step, len(frame))])...)
	}
	return out
}

// FuzzRecordSequence publishes a chain of records built from the input:
// left intact, the reader hands out exactly the frames written, in order,
// then reports the peer gone; corrupted, it returns frames or a clean
// error, never a panic or a hang.
func FuzzRecordSequence(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 0, 5},
		{1, 3, 0x10, 0, 0, 0, 0x02, 2, 3, 4},
		{1, 1, 0x13, 0x88, 0, 0, 0, 0x0f, 0xa0},
		{0, 0, 0, 5, 0, 0, 0xff, 0xff, 0x7f},
		{3, 2, 0, 4, 1, 2, 0, 8},
		{},
	} {
		f.Add(seed)
	}
	o := testOptions()
	o.RingSize = minRingSize
	o.MaxFrameSize = 64 << 10
	o.Spin = 0
	tr := newTransport(f, o)

	f.Fuzz(func(t *testing.T, script []byte) {
		s := buildRecords(script, minRingSize)
		r := newRawConn(t, tr)
		defer r.close()
		in := r.seg.ring(clientToServer)
		copy(in.data, s.ring)
		in.head.Store(uint64(len(s.ring)))
		r.peer.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := 0
		for {
			fr, err := r.c.ReadFrame(ctx)
			if err != nil {
				checkEnd(t, s, got, err, ctx.Err() != nil)
				return
			}
			if !s.corrupted {
				checkFrame(t, s, got, fr)
			}
			got++
			fr.Release()
		}
	})
}

func checkFrame(t *testing.T, s *recordScript, i int, fr *kernel.Frame) {
	t.Helper()
	if i >= len(s.want) {
		t.Fatalf("frame %d (call %d) read; %d were written", i, fr.CallID, len(s.want))
	}
	w := s.want[i]
	if fr.CallID != w.CallID || fr.Method != w.Method || fr.Metadata["n"] != w.Metadata["n"] || !bytes.Equal(fr.Payload, w.Payload) {
		t.Fatalf("frame %d: call %d, %q, %d bytes; want call %d, %q, %d bytes", i, fr.CallID, fr.Method, len(fr.Payload), w.CallID, w.Method, len(w.Payload))
	}
}

func checkEnd(t *testing.T, s *recordScript, got int, err error, hung bool) {
	t.Helper()
	if hung {
		t.Fatalf("ReadFrame hung on %d bytes of records", len(s.ring))
	}
	if !s.corrupted {
		if got != len(s.want) || !errors.Is(err, kernel.ErrPeerGone) {
			t.Fatalf("read %d of %d frames, then %v; want all, then ErrPeerGone", got, len(s.want), err)
		}
		return
	}
	if !errors.Is(err, kernel.ErrPeerGone) && !errors.Is(err, kernel.ErrMalformedFrame) &&
		!errors.Is(err, kernel.ErrFrameTooLarge) && !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("ReadFrame on corrupted records: unexpected error %v", err)
	}
}
