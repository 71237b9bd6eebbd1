package kernel_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// wire returns f encoded as it goes on the wire.
func wire(f *kernel.Frame) []byte {
	return append(kernel.AppendFrameHeader(nil, f), f.Payload...)
}

func sameFrame(a, b *kernel.Frame) bool {
	return a.Type == b.Type && a.Flags == b.Flags && a.CallID == b.CallID && a.Method == b.Method &&
		a.Codec == b.Codec && a.Timeout == b.Timeout && a.Code == b.Code && a.Message == b.Message &&
		a.Credit == b.Credit && maps.Equal(a.Metadata, b.Metadata) && bytes.Equal(a.Payload, b.Payload)
}

func TestFrameCodecRoundTripsEveryField(t *testing.T) {
	cases := []struct {
		name string
		f    kernel.Frame
		want func(*kernel.Frame) // adjusts the expectation where encoding is lossy by design
	}{
		{"bare ping", kernel.Frame{Type: kernel.FramePing}, nil},
		{"request with every request field", kernel.Frame{
			Type: kernel.FrameRequest, Flags: kernel.FlagEndStream | kernel.FlagStream, CallID: 1<<64 - 1,
			Method: "Echo.Say", Codec: "protobuf", Timeout: 2500 * time.Millisecond,
			Metadata: kernel.Metadata{"trace-id": "abc", "": "empty key", "empty value": "", "long": strings.Repeat("v", 300)},
			Payload:  []byte{0x0a, 0x02, 'h', 'i'},
		}, nil},
		{"response with status", kernel.Frame{
			Type: kernel.FrameResponse, Flags: kernel.FlagRetryable, CallID: 42,
			Code: kernel.Unavailable, Message: "shutting down: ünïcode ok", Codec: "json",
		}, nil},
		{"largest status code", kernel.Frame{Type: kernel.FrameResponse, Code: 1 << 31}, nil},
		// A code the decoder refuses (a handler's own numbering) must not
		// make a frame that closes the connection at its receiver.
		{"code above the largest is sent as Unknown", kernel.Frame{Type: kernel.FrameResponse, Code: 1<<31 + 1, Message: "m"},
			func(f *kernel.Frame) { f.Code = kernel.Unknown }},
		{"largest uint32 code is sent as Unknown", kernel.Frame{Type: kernel.FrameResponse, Code: 1<<32 - 1},
			func(f *kernel.Frame) { f.Code = kernel.Unknown }},
		{"window update", kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: 3, Credit: 1<<32 - 1}, nil},
		{"timeout below a microsecond still means a deadline", kernel.Frame{Type: kernel.FrameRequest, Timeout: 10 * time.Nanosecond},
			func(f *kernel.Frame) { f.Timeout = time.Microsecond }},
		{"timeout is kept to the microsecond", kernel.Frame{Type: kernel.FrameRequest, Timeout: 1500 * time.Nanosecond},
			func(f *kernel.Frame) { f.Timeout = time.Microsecond }},
		{"negative timeout means none", kernel.Frame{Type: kernel.FrameRequest, Timeout: -time.Second},
			func(f *kernel.Frame) { f.Timeout = 0 }},
		{"large payload", kernel.Frame{Type: kernel.FrameStreamData, Payload: bytes.Repeat([]byte{7}, 70000)}, nil},
	}
	var in kernel.Interner
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := wire(&tc.f)
			if got := kernel.FrameHeaderLen(&tc.f) + len(tc.f.Payload); got != len(w) {
				t.Fatalf("FrameHeaderLen+payload = %d, encoded %d bytes", got, len(w))
			}
			n, err := kernel.ReadFrameLength(w, 0)
			if err != nil || n != len(w)-kernel.FramePrefixLen {
				t.Fatalf("ReadFrameLength = %d, %v; want %d", n, err, len(w)-kernel.FramePrefixLen)
			}
			var got kernel.Frame
			if err := kernel.DecodeFrame(w[kernel.FramePrefixLen:], &got, &in); err != nil {
				t.Fatal(err)
			}
			want := tc.f
			if tc.want != nil {
				tc.want(&want)
			}
			if !sameFrame(&got, &want) {
				t.Fatalf("decoded %+v\n    want %+v", got, want)
			}
		})
	}
}

func TestReadFrameLength(t *testing.T) {
	// With no maximum the largest length is returned, except where an int
	// cannot hold it (32 bits).
	largest := uint64(1<<32 - 1)
	noMax, noMaxErr := int(largest), error(nil)
	if largest > math.MaxInt {
		noMax, noMaxErr = 0, kernel.ErrFrameTooLarge
	}
	cases := []struct {
		name   string
		prefix []byte
		max    int
		want   int
		err    error
	}{
		{"smallest frame", []byte{0, 0, 0, 16}, 100, 16, nil},
		{"exactly the maximum", []byte{0, 0, 0, 100}, 100, 100, nil},
		{"one over the maximum", []byte{0, 0, 0, 101}, 100, 0, kernel.ErrFrameTooLarge},
		{"almost 4 GiB", []byte{0xff, 0xff, 0xff, 0xf0}, kernel.DefaultMaxFrameSize, 0, kernel.ErrFrameTooLarge},
		{"no maximum", []byte{0xff, 0xff, 0xff, 0xff}, 0, noMax, noMaxErr},
		{"shorter than the fixed header", []byte{0, 0, 0, 15}, 100, 0, kernel.ErrMalformedFrame},
		{"truncated prefix", []byte{0, 0, 1}, 100, 0, kernel.ErrMalformedFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, err := kernel.ReadFrameLength(tc.prefix, tc.max)
			if n != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("ReadFrameLength(% x, %d) = %d, %v; want %d, %v", tc.prefix, tc.max, n, err, tc.want, tc.err)
			}
		})
	}
}

// TestDecodeFrameRejectsEveryTruncationOfTheHeader cuts a frame body at
// every byte before its payload.
func TestDecodeFrameRejectsEveryTruncationOfTheHeader(t *testing.T) {
	f := &kernel.Frame{Type: kernel.FrameRequest, CallID: 5, Method: "Echo.Say", Timeout: time.Second,
		Metadata: kernel.Metadata{"k": "v"}, Payload: []byte("payload")}
	body := wire(f)[kernel.FramePrefixLen:]
	headerEnd := len(body) - len(f.Payload)
	for n := range headerEnd {
		var got kernel.Frame
		if err := kernel.DecodeFrame(body[:n], &got, nil); !errors.Is(err, kernel.ErrMalformedFrame) {
			t.Errorf("body cut to %d of %d bytes: %v, want ErrMalformedFrame", n, headerEnd, err)
		}
	}
}

func TestDecodeFrameSkipsUnknownTags(t *testing.T) {
	var fields []byte
	fields = append(fields, 1, 3, 'A', '.', 'b')           // method
	fields = append(fields, 99, 4, 0xde, 0xad, 0xbe, 0xef) // a tag from the future
	fields = append(fields, 200, 0)                        // another, empty
	fields = append(fields, 99, 1, 0)                      // unknown ones may repeat
	fields = append(fields, 2, 2, 'p', 'b')                // codec
	body := []byte{kernel.FrameMagic, kernel.FrameVersion, byte(kernel.FrameRequest), 0, 0, 0, 0, 0, 0, 0, 0, 1}
	body = binary.BigEndian.AppendUint32(body, uint32(len(fields)))
	body = append(append(body, fields...), "data"...)
	var f kernel.Frame
	if err := kernel.DecodeFrame(body, &f, nil); err != nil {
		t.Fatal(err)
	}
	if f.Method != "A.b" || f.Codec != "pb" || string(f.Payload) != "data" || f.CallID != 1 {
		t.Fatalf("decoded %+v", f)
	}
}

func TestDecodeFrameErrorsSayWhatIsWrong(t *testing.T) {
	header := func(typ byte, fields ...byte) []byte {
		b := []byte{kernel.FrameMagic, kernel.FrameVersion, typ, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		b = binary.BigEndian.AppendUint32(b, uint32(len(fields)))
		return append(b, fields...)
	}
	cases := []struct {
		name string
		body []byte
		want string
	}{
		{"bad magic", append([]byte{'H', 1}, header(1)[2:]...), "bad magic"},
		{"unknown version", append([]byte{kernel.FrameMagic, 9}, header(1)[2:]...), "unsupported protocol version 9"},
		{"unknown type", header(9), "unknown frame type 9"},
		{"fields length past the end", append(header(1)[:12], 0, 0, 0, 1), "runs past the frame end"},
		{"field length past the fields", header(1, 1, 5, 'a'), "runs past the fields section"},
		{"field length not a uvarint", header(1, 1, 0x80), "runs past the fields section"},
		{"timeout not one uvarint", header(1, 3, 2, 1, 1), "is not one uvarint"},
		{"status code out of range", header(2, 4, 5, 0x81, 0x80, 0x80, 0x80, 0x08), "out of range"},
		{"credit out of range", header(8, 7, 5, 0x80, 0x80, 0x80, 0x80, 0x10), "credit out of range"},
		{"metadata key past its field", header(1, 6, 2, 5, 'k'), "metadata key"},
		{"method twice", header(1, 1, 1, 'a', 2, 1, 'j', 1, 1, 'b'), "tag 1 appears twice"},
		{"credit twice", header(8, 7, 1, 1, 7, 1, 2), "tag 7 appears twice"},
		{"timeout twice, the same", header(1, 3, 1, 5, 3, 1, 5), "tag 3 appears twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f kernel.Frame
			err := kernel.DecodeFrame(tc.body, &f, nil)
			if !errors.Is(err, kernel.ErrMalformedFrame) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeFrame: %v, want ErrMalformedFrame saying %q", err, tc.want)
			}
		})
	}
}

func TestInternerReturnsTheSameStringWithoutAllocating(t *testing.T) {
	var in kernel.Interner
	name := []byte("Echo.Say")
	first := in.String(name)
	if allocs := testing.AllocsPerRun(100, func() { _ = in.String(name) }); allocs != 0 {
		t.Fatalf("interning a known name allocates %v times", allocs)
	}
	if again := in.String(name); again != first || again != "Echo.Say" {
		t.Fatalf("got %q", again)
	}
	var nilInterner *kernel.Interner
	if s := nilInterner.String(name); s != "Echo.Say" {
		t.Fatalf("nil Interner: %q", s)
	}
}

// FuzzDecodeFrame feeds DecodeFrame arbitrary bodies: it must never panic,
// and whatever it accepts must encode back to a frame that decodes the
// same.
func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range []kernel.Frame{
		{Type: kernel.FramePing},
		{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "Echo.Say", Codec: "protobuf",
			Timeout: time.Second, Metadata: kernel.Metadata{"a": "b", "trace": "x"}, Payload: []byte("hello")},
		{Type: kernel.FrameResponse, CallID: 2, Code: kernel.NotFound, Message: "no such method", Payload: []byte{1, 2, 3}},
		{Type: kernel.FrameWindowUpdate, Credit: 65535},
		{Type: kernel.FrameGoAway},
	} {
		f.Add(wire(&fr)[kernel.FramePrefixLen:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got kernel.Frame
		var in kernel.Interner
		if err := kernel.DecodeFrame(body, &got, &in); err != nil {
			if !errors.Is(err, kernel.ErrMalformedFrame) {
				t.Fatalf("error %v does not wrap ErrMalformedFrame", err)
			}
			return
		}
		again := wire(&got)
		if n := kernel.FrameHeaderLen(&got) + len(got.Payload); n != len(again) {
			t.Fatalf("FrameHeaderLen+payload = %d, encoded %d bytes", n, len(again))
		}
		n, err := kernel.ReadFrameLength(again, 0)
		if err != nil || n != len(again)-kernel.FramePrefixLen {
			t.Fatalf("re-encoded length prefix: %d, %v; want %d", n, err, len(again)-kernel.FramePrefixLen)
		}
		var back kernel.Frame
		if err := kernel.DecodeFrame(again[kernel.FramePrefixLen:], &back, &in); err != nil {
			t.Fatalf("re-encoded frame does not decode: %v\nframe %+v", err, got)
		}
		if !sameFrame(&got, &back) {
			t.Fatalf("round trip changed the frame:\n first %+v\nsecond %+v", got, back)
		}
	})
}

// BenchmarkAppendFrameHeader is a stream message's header, sized and
// written as a transport does for every frame it sends.
func BenchmarkAppendFrameHeader(b *testing.B) {
	f := &kernel.Frame{Type: kernel.FrameStreamData, CallID: 7, Payload: make([]byte, 16)}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = kernel.AppendFrameHeader(buf[:0], f)
		if len(buf) != kernel.FrameHeaderLen(f) {
			b.Fatalf("wrote %d bytes, FrameHeaderLen %d", len(buf), kernel.FrameHeaderLen(f))
		}
	}
}

// A timeout larger than a time.Duration holds is read as the longest one,
// never as a negative duration, which would read as a deadline already
// passed.
func TestDecodeFrameClampsAHugeTimeout(t *testing.T) {
	huge := binary.AppendUvarint(nil, 1<<64-1) // microseconds
	fields := append([]byte{3, byte(len(huge))}, huge...)
	body := []byte{kernel.FrameMagic, kernel.FrameVersion, byte(kernel.FrameRequest), 0, 0, 0, 0, 0, 0, 0, 0, 1}
	body = binary.BigEndian.AppendUint32(body, uint32(len(fields)))
	body = append(body, fields...)
	var f kernel.Frame
	if err := kernel.DecodeFrame(body, &f, nil); err != nil {
		t.Fatal(err)
	}
	if want := time.Duration(1<<63-1) / time.Microsecond * time.Microsecond; f.Timeout != want {
		t.Errorf("timeout %v; want the longest whole number of microseconds, %v", f.Timeout, want)
	}
}

// Values of the kernel's enumerations print by name, and a value without
// one prints its number, so that a log or an error shows what arrived.
func TestEnumerationsPrintTheirNames(t *testing.T) {
	for _, tc := range []struct {
		v    fmt.Stringer
		want string
	}{
		{kernel.ClientSide, "client"}, {kernel.ServerSide, "server"}, {kernel.Side(7), "Side(7)"},
		{kernel.CallStage, "call"}, {kernel.AttemptStage, "attempt"}, {kernel.Stage(0), "Stage(0)"},
		{kernel.ClientStreaming, "client-streaming"}, {kernel.ServerStreaming, "server-streaming"},
		{kernel.BidiStreaming, "bidi-streaming"}, {kernel.StreamKind(9), "StreamKind(9)"},
		{kernel.FrameWindowUpdate, "WindowUpdate"}, {kernel.FrameType(0), "FrameType(0)"}, {kernel.FrameType(200), "FrameType(200)"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%T %d prints %q; want %q", tc.v, tc.v, got, tc.want)
		}
	}
}

// A timeout field of 0 microseconds says the caller's deadline had no time
// left when the request was sent (docs/protocol.md: only an absent field
// means no deadline). Read as Timeout 0, which Frame documents as "none",
// the server ran the call with no deadline at all; it reads as the least
// deadline there is, as the encoder writes one under a microsecond.
func TestDecodeFrameReadsAZeroTimeoutAsADeadline(t *testing.T) {
	fields := []byte{3, 1, 0} // tag 3 timeout, length 1, uvarint 0
	body := []byte{kernel.FrameMagic, kernel.FrameVersion, byte(kernel.FrameRequest), byte(kernel.FlagEndStream), 0, 0, 0, 0, 0, 0, 0, 1}
	body = binary.BigEndian.AppendUint32(body, uint32(len(fields)))
	body = append(body, fields...)
	var f kernel.Frame
	if err := kernel.DecodeFrame(body, &f, nil); err != nil {
		t.Fatal(err)
	}
	if f.Timeout <= 0 || f.Timeout > time.Microsecond {
		t.Fatalf("timeout field of 0µs decoded as Timeout %v; want a deadline (at most 1µs), not \"none\"", f.Timeout)
	}
	// Without the field, no deadline.
	body = binary.BigEndian.AppendUint32(body[:12], 0)
	f = kernel.Frame{}
	if err := kernel.DecodeFrame(body, &f, nil); err != nil || f.Timeout != 0 {
		t.Fatalf("no timeout field: Timeout %v, %v; want 0 (none)", f.Timeout, err)
	}
}
