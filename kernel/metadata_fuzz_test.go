package kernel_test

import (
	"encoding/binary"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// metadataField is one metadata pair as a frame's fields section holds it:
// tag 6, uvarint length, uvarint key length, key, value.
func metadataField(k, v string) []byte {
	pair := binary.AppendUvarint(nil, uint64(len(k)))
	pair = append(append(pair, k...), v...)
	b := binary.AppendUvarint([]byte{6}, uint64(len(pair)))
	return append(b, pair...)
}

// requestWithFields returns a request body whose fields section is fields,
// so that every input reaches the field loop instead of failing on the
// fixed header.
func requestWithFields(fields, payload []byte) []byte {
	b := []byte{kernel.FrameMagic, kernel.FrameVersion, byte(kernel.FrameRequest), 0, 0, 0, 0, 0, 0, 0, 0, 1}
	b = binary.BigEndian.AppendUint32(b, uint32(len(fields)))
	return append(append(b, fields...), payload...)
}

// metadataSeeds are fields sections aimed at the metadata pairs: many of
// them, repeated and empty keys, a key length that claims too much, and
// pairs mixed with the other fields.
func metadataSeeds() [][]byte {
	var many, tiny, dup []byte
	for i := range 300 {
		many = append(many, metadataField("key-"+strconv.Itoa(i), strings.Repeat("v", i%17))...)
		tiny = append(tiny, metadataField("", "")...)
		dup = append(dup, metadataField("same", strconv.Itoa(i))...)
	}
	mixed := append([]byte{1, 8}, "Echo.Say"...)
	mixed = append(mixed, metadataField("trace", "abc")...)
	mixed = append(append(mixed, 2, 8), "protobuf"...)
	mixed = append(mixed, metadataField("ünï", strings.Repeat("x", 300))...)
	return [][]byte{
		nil,
		metadataField("a", "b"),
		many,
		tiny,
		dup,
		mixed,
		{6, 0},                   // a pair with no key length
		{6, 2, 5, 'k'},           // a key longer than its pair
		{6, 1, 0x80},             // a key length that is no uvarint
		{6, 3, 0x80, 0x80, 0x80}, // a key length that ends past the pair
		{6, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, // a pair length of 2^63
		append(metadataField("k", "v"), 9, 2, 'x', 'y'),                 // an unknown tag after a pair
	}
}

// FuzzDecodeMetadata aims at the metadata pairs of a request: the input is
// the fields section, under a valid fixed header. DecodeFrame must not
// panic, must refuse with ErrMalformedFrame (or ErrMetadataTooLarge, once
// it bounds metadata), and what it accepts can hold no more than the bytes
// it came from and must survive a round trip.
func FuzzDecodeMetadata(f *testing.F) {
	for _, s := range metadataSeeds() {
		f.Add(s, []byte("payload"))
	}
	f.Fuzz(func(t *testing.T, fields, payload []byte) {
		var got kernel.Frame
		var in kernel.Interner
		err := kernel.DecodeFrame(requestWithFields(fields, payload), &got, &in)
		if err != nil {
			if !errors.Is(err, kernel.ErrMalformedFrame) && !errors.Is(err, kernel.ErrMetadataTooLarge) {
				t.Fatalf("error %v wraps neither ErrMalformedFrame nor ErrMetadataTooLarge", err)
			}
			return
		}
		checkMetadataFitsFields(t, got.Metadata, fields)
		again := wire(&got)
		var back kernel.Frame
		if err := kernel.DecodeFrame(again[kernel.FramePrefixLen:], &back, &in); err != nil {
			t.Fatalf("re-encoded frame does not decode: %v\nmetadata %q", err, got.Metadata)
		}
		if !maps.Equal(got.Metadata, back.Metadata) || string(back.Payload) != string(payload) {
			t.Fatalf("round trip changed the metadata or payload:\n first %q\nsecond %q", got.Metadata, back.Metadata)
		}
	})
}

// checkMetadataFitsFields fails if md holds more than fields could carry:
// each pair costs at least its tag, its length and its key length.
func checkMetadataFitsFields(t *testing.T, md kernel.Metadata, fields []byte) {
	t.Helper()
	n := 0
	for k, v := range md {
		n += 3 + len(k) + len(v)
	}
	if n > len(fields) {
		t.Fatalf("%d metadata entries need %d bytes; the fields section has %d", len(md), n, len(fields))
	}
}

// FuzzReadFrameLength checks the length prefix against max: it must agree
// with the big-endian value, refuse what is shorter than the fixed header
// with ErrMalformedFrame and what exceeds a positive max with
// ErrFrameTooLarge, and never panic on a short prefix.
func FuzzReadFrameLength(f *testing.F) {
	for _, s := range []struct {
		prefix []byte
		max    int
	}{
		{[]byte{0, 0, 0, 16}, 0}, {[]byte{0, 0, 0, 15}, 0}, {[]byte{0, 0, 1, 0}, 255}, {[]byte{0xff, 0xff, 0xff, 0xff}, 0},
		{[]byte{0xff, 0xff, 0xff, 0xff}, -1}, {[]byte{0, 0}, 0}, {nil, 4 << 20}, {[]byte{0, 0x40, 0, 0, 9}, 4 << 20},
	} {
		f.Add(s.prefix, s.max)
	}
	f.Fuzz(func(t *testing.T, prefix []byte, max int) {
		n, err := kernel.ReadFrameLength(prefix, max)
		if len(prefix) < kernel.FramePrefixLen {
			if !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("%d-byte prefix: %d, %v; want ErrMalformedFrame", len(prefix), n, err)
			}
			return
		}
		v := uint64(binary.BigEndian.Uint32(prefix))
		switch {
		case v < kernel.FrameFixedLen:
			if !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("length %d: %v; want ErrMalformedFrame", v, err)
			}
		case max > 0 && v > uint64(max):
			if !errors.Is(err, kernel.ErrFrameTooLarge) {
				t.Fatalf("length %d, max %d: %v; want ErrFrameTooLarge", v, max, err)
			}
		case err != nil || uint64(n) != v:
			t.Fatalf("length %d, max %d: %d, %v", v, max, n, err)
		}
	})
}

// FuzzDecodeMetadataLimits decodes the same fields sections under small
// FrameLimits: what is accepted keeps to them (so that the writer's Check
// passes what the reader took), and what is refused for its metadata says
// so and is malformed too.
func FuzzDecodeMetadataLimits(f *testing.F) {
	for i, s := range metadataSeeds() {
		f.Add(s, uint8(i), uint16(i*64))
	}
	f.Fuzz(func(t *testing.T, fields []byte, maxEntries uint8, maxBytes uint16) {
		lim := kernel.FrameLimits{MaxMetadataEntries: int(maxEntries), MaxMetadataBytes: int(maxBytes)}
		var got kernel.Frame
		err := lim.Decode(requestWithFields(fields, nil), &got, nil)
		if errors.Is(err, kernel.ErrMetadataTooLarge) && !errors.Is(err, kernel.ErrMalformedFrame) {
			t.Fatalf("refused for its metadata but not malformed: %v", err)
		}
		if err != nil {
			if !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("error %v does not wrap ErrMalformedFrame", err)
			}
			return
		}
		if err := lim.Check(&got); err != nil {
			t.Fatalf("decoded under %+v, then refused by Check: %v", lim, err)
		}
		checkMetadataFitsFields(t, got.Metadata, fields)
	})
}
