package kernel_test

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

func frameWithMetadata(entries, valueLen int) *kernel.Frame {
	md := make(kernel.Metadata, entries)
	for i := range entries {
		md["k"+strconv.Itoa(i)] = strings.Repeat("v", valueLen)
	}
	return &kernel.Frame{Type: kernel.FrameRequest, CallID: 7, Method: "Echo.Say", Metadata: md}
}

func encode(f *kernel.Frame) []byte {
	return kernel.AppendFrameHeader(nil, f)[kernel.FramePrefixLen:]
}

// The decoder stops at the limit instead of building a map of whatever
// size the frame allows; the writer's Check refuses the same frames.
func TestFrameLimitsMetadata(t *testing.T) {
	lim := kernel.FrameLimits{MaxMetadataEntries: 8, MaxMetadataBytes: 1000}
	cases := []struct {
		name    string
		f       *kernel.Frame
		tooMuch bool
	}{
		{"at the entry limit", frameWithMetadata(8, 10), false},
		{"one entry over", frameWithMetadata(9, 1), true},
		{"at the byte limit", frameWithMetadata(4, 250-2), false}, // keys "k0".."k3" are 2 bytes
		{"one byte over", frameWithMetadata(4, 250-1), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got kernel.Frame
			err := lim.Decode(encode(tc.f), &got, nil)
			checkErr := lim.Check(tc.f)
			if !tc.tooMuch {
				if err != nil || checkErr != nil {
					t.Fatalf("Decode: %v, Check: %v; want both nil", err, checkErr)
				}
				if len(got.Metadata) != len(tc.f.Metadata) {
					t.Fatalf("decoded %d entries, want %d", len(got.Metadata), len(tc.f.Metadata))
				}
				return
			}
			if !errors.Is(err, kernel.ErrMetadataTooLarge) || !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("Decode: %v; want ErrMetadataTooLarge and ErrMalformedFrame", err)
			}
			if !errors.Is(checkErr, kernel.ErrMetadataTooLarge) || kernel.CodeOf(checkErr) != kernel.ResourceExhausted {
				t.Fatalf("Check: %v; want ResourceExhausted wrapping ErrMetadataTooLarge", checkErr)
			}
			if !strings.Contains(checkErr.Error(), "max_metadata_") {
				t.Errorf("Check: %q does not name the option to raise", checkErr)
			}
		})
	}
}

// The same key sent over and over makes a map of one entry; the byte
// bound still holds it to the limit.
func TestFrameLimitsRepeatedKey(t *testing.T) {
	var body []byte
	f := &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}
	body = kernel.AppendFrameHeader(body, f)
	// Append 100k copies of one metadata pair to the fields section by
	// building the frame by hand: one pair is tag 6, length 3, key length 1,
	// key "k", value "v".
	pair := []byte{6, 3, 1, 'k', 'v'}
	fields := make([]byte, 0, 100_000*len(pair))
	for range 100_000 {
		fields = append(fields, pair...)
	}
	frame := append([]byte(nil), body[kernel.FramePrefixLen:]...)
	frame[12], frame[13], frame[14], frame[15] = byte(len(fields)>>24), byte(len(fields)>>16), byte(len(fields)>>8), byte(len(fields))
	frame = append(frame, fields...)
	var got kernel.Frame
	if err := kernel.DecodeFrame(frame, &got, nil); !errors.Is(err, kernel.ErrMetadataTooLarge) {
		t.Fatalf("DecodeFrame of 100k repeated pairs: %v; want ErrMetadataTooLarge", err)
	}
}

func TestFrameLimitsDefaults(t *testing.T) {
	var got kernel.Frame
	if err := kernel.DecodeFrame(encode(frameWithMetadata(kernel.DefaultMaxMetadataEntries, 1)), &got, nil); err != nil {
		t.Fatalf("default entries limit: %v", err)
	}
	got = kernel.Frame{}
	if err := kernel.DecodeFrame(encode(frameWithMetadata(kernel.DefaultMaxMetadataEntries+1, 1)), &got, nil); !errors.Is(err, kernel.ErrMetadataTooLarge) {
		t.Fatalf("one over the default entries limit: %v; want ErrMetadataTooLarge", err)
	}
}

// The entry limit counts the pairs a frame carries (docs/protocol.md: "a
// frame carries at most 256 pairs"), not the distinct keys they leave in
// the map: pairs with one key, and empty ones that cost nothing against
// the byte limit, passed any number.
func TestFrameLimitsCountPairsNotDistinctKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair []byte
	}{
		{"empty pairs", []byte{6, 1, 0}},                // key length 0, no key, no value
		{"one key repeated", []byte{6, 3, 1, 'k', 'v'}}, // key "k", value "v"
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{kernel.DefaultMaxMetadataEntries, kernel.DefaultMaxMetadataEntries + 1} {
				var fields []byte
				for range n {
					fields = append(fields, tc.pair...)
				}
				frame := encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1})
				binary.BigEndian.PutUint32(frame[12:16], uint32(len(fields)))
				frame = append(frame, fields...)
				var got kernel.Frame
				err := kernel.DecodeFrame(frame, &got, nil)
				if n <= kernel.DefaultMaxMetadataEntries {
					if err != nil {
						t.Fatalf("%d pairs: %v", n, err)
					}
					continue
				}
				if !errors.Is(err, kernel.ErrMetadataTooLarge) {
					t.Fatalf("%d pairs (%d distinct keys): %v; want ErrMetadataTooLarge", n, len(got.Metadata), err)
				}
			}
		})
	}
}
