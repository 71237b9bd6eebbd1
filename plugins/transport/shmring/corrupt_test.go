//go:build linux

package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// Each way a peer can write records no kernrpc peer writes ends the
// connection with ErrMalformedFrame naming the fault, logged at WARN:
// never a panic, a hang, or a frame made of it.
func TestCorruptRecordsCloseTheConnectionNamingTheFault(t *testing.T) {
	frame := encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Echo", Payload: []byte("hello")})
	big := encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 2, Payload: pattern(3000, 1)})
	word := func(size uint32, kind uint8) []byte {
		b := make([]byte, wordLen)
		putWord(b, 0, size, kind)
		return b
	}
	join := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	outside := rawRecord(kindFrame, frame)
	putContent(outside, 0, 4, len(frame))
	header := make([]byte, recordHeaderLen)
	putWord(header, 0, recordHeaderLen, kindFrame)
	putContent(header, 0, recordHeaderLen, 0)
	reserved := rawRecord(kindFrame, frame)
	reserved[6] = 1
	// testOptions' rings are 64KiB: a record's largest is a quarter of that.
	huge := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 3, Payload: pattern(20000, 1)}))
	fields := append([]byte(nil), frame...)
	binary.BigEndian.PutUint32(fields[kernel.FramePrefixLen+12:], 1<<20)
	for _, tc := range []struct {
		name string
		data []byte
		head uint64 // 0: len(data)
		want string
	}{
		{"a size not a multiple of 8", word(12, kindPad), 0, "record of 12 bytes at 0: want a positive multiple of 8"},
		{"a record past what was published", rawRecord(kindFrame, frame), 8, "runs past what was published (8)"},
		{"a wrap marker short of the ring's end", word(16, kindWrap), 16, "wrap marker of 16 bytes at 0 does not reach the ring's end"},
		{"a content record shorter than its header", word(8, kindFrame), 0, "content record of 8 bytes at 0 is shorter than its header"},
		{"content outside its record", outside, 0, "of the " + strconv.Itoa(len(outside)) + "-byte record at 0 is outside it"},
		{"a record of an unknown kind", word(8, 99), 0, "record of unknown kind 99 at 0"},
		{"a record word whose zero bytes are not", reserved, 0, "has bytes 5-7 of its first word set (0x000100)"},
		{"a content record larger than a quarter ring", huge, 0, "content record of " + strconv.Itoa(len(huge)) + " bytes at 0 is larger than a quarter of the ring (16384)"},
		{"a frame shorter than its record's content", rawRecord(kindFrame, append(append([]byte(nil), frame...), 0, 0, 0, 0)), 0, "does not match its record's content"},
		{"a content record too short for a frame", header, 0, "malformed frame: 0 bytes, shorter than the length prefix (4)"},
		{"a fields length past the frame's end", rawRecord(kindFrame, fields), 0, "fields length runs past the frame end"},
		{"a chunk without its beginning", rawRecord(kindChunk, big[1000:]), 0, "a piece of a chunked frame arrived without its beginning"},
		{"a chunked frame begun twice", join(rawRecord(kindFirstChunk, big[:1000]), rawRecord(kindFirstChunk, big[:1000])), 0, "a chunked frame began before the previous one ended"},
		{"chunks longer than their frame", join(rawRecord(kindFirstChunk, big[:1000]), rawRecord(kindChunk, append(big[1000:], 1, 2, 3))), 0, "add up to more than its length"},
		{"a head more than a ring ahead", nil, 1 << 40, "the writer's head moved to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncbuf.Buffer
			o := testOptions()
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			r := newRawConn(t, newTransport(t, o))
			defer r.close()
			in := r.seg.ring(clientToServer)
			copy(in.data, tc.data)
			head := tc.head
			if head == 0 {
				head = uint64(len(tc.data))
			}
			in.head.Store(head)
			f, err := r.c.ReadFrame(timeout(t, 5*time.Second))
			if err == nil {
				typ, id := f.Type, f.CallID
				f.Release()
				t.Fatalf("ReadFrame made frame %v (call %d) of it", typ, id)
			}
			if !errors.Is(err, kernel.ErrMalformedFrame) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadFrame: %v; want ErrMalformedFrame saying %q", err, tc.want)
			}
			if _, err := r.c.ReadFrame(timeout(t, time.Second)); !errors.Is(err, kernel.ErrClosed) {
				t.Errorf("ReadFrame after the fault: %v; want the connection closed", err)
			}
			if !strings.Contains(logs.String(), "level=WARN msg=\"shm-ring: connection closed\"") || !strings.Contains(logs.String(), tc.want) {
				t.Errorf("the fault was not logged at WARN with its reason:\n%s", logs.String())
			}
		})
	}
}

// A reader that lists a held record whose end is not a multiple of 8 must
// not crash the writer: the writer skips the "island" to its end, which
// leaves the cursor off the 8-byte grid, and a later wrap marker of 4
// bytes at the ring's end is written past the end of the ring's slice.
func TestAMisalignedHeldEntryClosesTheConnectionNotTheProcess(t *testing.T) {
	o := testOptions()
	o.RingSize = minRingSize
	o.Spin = 0
	o.WaitTimeout = kernel.Duration(2 * time.Second)
	r := newRawConn(t, newTransport(t, o))
	panicked := false
	defer func() {
		if !panicked {
			r.close()
			return
		}
		// The panic left the producer's lock held: Close would wait for
		// it forever, so end the connection without an end record.
		r.peer.Close()
		r.c.die(slog.LevelDebug, kernel.ErrClosed)
		r.c.watching.Wait()
	}()
	out := r.seg.ring(serverToClient)
	size := uint64(len(out.data))
	payload := pattern(476, 1) // 16 + 20 + 476 = 512-byte records
	write := func(i int) (err error) {
		defer func() {
			if p := recover(); p != nil {
				panicked = true
				err = fmt.Errorf("PANIC: %v", p)
			}
		}()
		return r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: uint64(i), Payload: append([]byte(nil), payload...)})
	}
	// Lap 0: the whole ring.
	for i := range int(size / 512) {
		if err := write(i); err != nil {
			t.Fatal(err)
		}
	}
	// As a malicious reader: everything released, but one record listed
	// as held: [15872, 16380), an end off the 8-byte grid.
	out.held[0][0].Store(size - 512)
	out.held[0][1].Store(size - 4)
	out.nheld.Store(1)
	out.tail.Store(out.head.Load())
	// Lap 1: up to the island, then past it. The writer may refuse the
	// held entry at once (the connection closes as corrupt); it must not
	// panic.
	for i := range int(size / 512) {
		if i == int(size/512)-1 {
			out.tail.Store(out.head.Load())
		}
		if err := write(100 + i); err != nil {
			if !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("WriteFrame %d of lap 1 after a misaligned held entry: %v", i, err)
			}
			return
		}
	}
	t.Fatal("the writer took a held entry whose end is off the 8-byte grid")
}
