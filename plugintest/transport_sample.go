package plugintest

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The frames the transport checks send, built so that a receiver can
// rebuild what it should have got, and the diffs they print when a frame
// arrives changed.

// transportSample is the frame the suite sends as call callID's seq-th,
// every header field set, with a payload of size bytes derived from both
// so that the receiver can rebuild it. With c, the payload is in a buffer
// from c.Buffer.
func transportSample(c kernel.Conn, callID uint64, seq, size int) *kernel.Frame {
	f := &kernel.Frame{
		Type:    kernel.FrameRequest,
		Flags:   kernel.FlagEndStream | kernel.FlagRetryable,
		CallID:  callID,
		Method:  "/plugintest.Echo/Call",
		Codec:   "proto",
		Timeout: 1500*time.Millisecond + time.Duration(seq)*time.Microsecond,
		Code:    kernel.Code(seq%16 + 1),
		Message: "sample",
		Metadata: kernel.Metadata{
			"seq":          strconv.Itoa(seq),
			"x-plugintest": "metadata value",
		},
		Credit: uint32(seq) + 7,
	}
	var buf []byte
	if c != nil {
		buf = c.Buffer(size)
	}
	f.Payload = transportFill(buf, callID<<32^uint64(seq), size)
	return f
}

// transportFill appends n pseudo-random bytes derived from seed to dst.
// They come in blocks of transportBlock bytes: one pseudo-random block per
// seed, repeated, each copy starting with its own index, so that a payload
// cut short, shifted or swapped with another call's is told apart, while a
// payload of megabytes costs copies, not a loop over every byte (which
// the race detector makes slow).
func transportFill(dst []byte, seed uint64, n int) []byte {
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	out := dst[start:]
	block := transportBlockOf(seed)
	for off := 0; off < n; off += transportBlock {
		k := copy(out[off:], block)
		var word [8]byte
		binary.LittleEndian.PutUint64(word[:], uint64(off/transportBlock)^block0(block))
		copy(out[off:off+min(8, k)], word[:])
	}
	return dst
}

// transportBlock is the size of transportFill's repeated block.
const transportBlock = 4096

func block0(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// transportBlockOf is seed's pseudo-random block.
func transportBlockOf(seed uint64) []byte {
	b := make([]byte, transportBlock)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := 0; i < transportBlock; i += 8 {
		// splitmix64: distinct seeds give unrelated streams.
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
	return b
}

// transportHeader copies f's header, not its payload (nor its owner: the
// copy is the caller's to send).
func transportHeader(f *kernel.Frame) *kernel.Frame {
	return &kernel.Frame{
		Type: f.Type, Flags: f.Flags, CallID: f.CallID, Method: f.Method, Codec: f.Codec, Timeout: f.Timeout,
		Code: f.Code, Message: f.Message, Metadata: f.Metadata, Credit: f.Credit,
	}
}

// transportDiff describes the first difference between a received frame
// and the one sent, or returns "".
func transportDiff(got, want *kernel.Frame) string {
	switch {
	case got.Type != want.Type:
		return "Type " + got.Type.String() + ", want " + want.Type.String()
	case got.Flags != want.Flags:
		return "Flags " + strconv.Itoa(int(got.Flags)) + ", want " + strconv.Itoa(int(want.Flags))
	case got.CallID != want.CallID:
		return "CallID " + strconv.FormatUint(got.CallID, 10) + ", want " + strconv.FormatUint(want.CallID, 10)
	case got.Method != want.Method:
		return "Method " + strconv.Quote(got.Method) + ", want " + strconv.Quote(want.Method)
	case got.Codec != want.Codec:
		return "Codec " + strconv.Quote(got.Codec) + ", want " + strconv.Quote(want.Codec)
	case got.Timeout != want.Timeout:
		return "Timeout " + got.Timeout.String() + ", want " + want.Timeout.String()
	case got.Code != want.Code:
		return "Code " + strconv.Itoa(int(got.Code)) + ", want " + strconv.Itoa(int(want.Code))
	case got.Message != want.Message:
		return "Message " + strconv.Quote(got.Message) + ", want " + strconv.Quote(want.Message)
	case got.Credit != want.Credit:
		return "Credit " + strconv.FormatUint(uint64(got.Credit), 10) + ", want " + strconv.FormatUint(uint64(want.Credit), 10)
	case len(got.Metadata) != len(want.Metadata):
		return "Metadata has " + strconv.Itoa(len(got.Metadata)) + " keys, want " + strconv.Itoa(len(want.Metadata))
	}
	for k, v := range want.Metadata {
		if g, ok := got.Metadata[k]; !ok || g != v {
			return "Metadata[" + strconv.Quote(k) + "] = " + strconv.Quote(g) + ", want " + strconv.Quote(v)
		}
	}
	return transportPayloadDiff(got.Payload, want.Payload)
}

func transportPayloadDiff(got, want []byte) string {
	if len(got) != len(want) {
		return "payload of " + strconv.Itoa(len(got)) + " bytes, want " + strconv.Itoa(len(want))
	}
	if bytes.Equal(got, want) {
		return ""
	}
	for i := range got {
		if got[i] != want[i] {
			return "payload byte " + strconv.Itoa(i) + " of " + strconv.Itoa(len(got)) + " is 0x" + strconv.FormatUint(uint64(got[i]), 16) +
				", want 0x" + strconv.FormatUint(uint64(want[i]), 16)
		}
	}
	return ""
}
