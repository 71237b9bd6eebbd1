package flatbuffers_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	fb "github.com/google/flatbuffers/go"
	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/raceflag"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

func newCodec(t testing.TB, options map[string]any) kernel.Codec {
	t.Helper()
	c, err := flatbuffers.Factory.Build(options, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// buildEcho encodes an echofb.Echo with the generated builder functions,
// as a handler building its answer by hand would.
func buildEcho(text string, payload []byte) []byte {
	b := fb.NewBuilder(len(payload) + len(text) + 64)
	p := b.CreateByteVector(payload)
	s := b.CreateString(text)
	echofb.EchoStart(b)
	echofb.EchoAddPayload(b, p)
	echofb.EchoAddText(b, s)
	b.Finish(echofb.EchoEnd(b))
	return b.FinishedBytes()
}

// within reports whether sub lies inside buf's memory.
func within(sub, buf []byte) bool {
	if len(sub) == 0 || len(buf) == 0 {
		return false
	}
	s, b := uintptr(unsafe.Pointer(&sub[0])), uintptr(unsafe.Pointer(&buf[0]))
	return s >= b && s+uintptr(len(sub)) <= b+uintptr(len(buf))
}

func TestRegisteredUnderName(t *testing.T) {
	c, err := kernel.NewCodec(flatbuffers.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewCodec(%q): %v", flatbuffers.Name, err)
	}
	if c.Name() != "flatbuffers" {
		t.Errorf("Name() = %q, want flatbuffers", c.Name())
	}
	if a, ok := c.(kernel.AliasingCodec); !ok || !a.AliasesInput() {
		t.Error("the codec does not declare kernel.AliasingCodec: the kernel would recycle bytes its values still read")
	}
}

func TestOptionsAreValidated(t *testing.T) {
	cases := []struct {
		opts map[string]any
		key  string
	}{
		{map[string]any{"builder_size": 0}, "builder_size"},
		{map[string]any{"builder_size": "64KiB", "max_pooled_builder": "1KiB"}, "max_pooled_builder"},
		{map[string]any{"builder_size": "3GiB", "max_pooled_builder": "4GiB"}, "builder_size"},
	}
	for _, tc := range cases {
		if _, err := flatbuffers.Factory.Build(tc.opts, "kernrpc.yaml"); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("options %v: err = %v, want an error naming %s", tc.opts, err, tc.key)
		}
	}
	if _, err := flatbuffers.Factory.Build(map[string]any{"builder_size": "64KiB", "max_pooled_builder": "4MiB"}, "kernrpc.yaml"); err != nil {
		t.Errorf("sane options refused: %v", err)
	}
}

// The zero-copy path: a generated table decoded by the codec reads its
// fields from the very bytes it was given, and decoding plus reading
// allocates nothing.
func TestTableReadsInPlace(t *testing.T) {
	c := newCodec(t, nil)
	payload := bytes.Repeat([]byte{0xab}, 64<<10)
	data := buildEcho("in place", payload)
	var e echofb.Echo
	if err := c.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	if got := e.PayloadBytes(); !bytes.Equal(got, payload) || !within(got, data) {
		t.Errorf("payload: %d bytes, inside the input: %v; want the 64 KiB read in place", len(got), within(got, data))
	}
	if got := e.Text(); string(got) != "in place" || !within(got, data) {
		t.Errorf("text %q, inside the input: %v; want it read in place", got, within(got, data))
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := c.Unmarshal(data, &e); err != nil || len(e.PayloadBytes()) != len(payload) || len(e.Text()) == 0 {
			t.Fatal("decode failed")
		}
	})
	if allocs != 0 {
		t.Errorf("Unmarshal and field access: %.1f allocations, want 0", allocs)
	}
}

// echopb.Echo, the echo service's message, keeps its payload in place too;
// only the text is copied into a string.
func TestEchoMessagePayloadAliasesTheInput(t *testing.T) {
	c := newCodec(t, nil)
	data := buildEcho("hi", []byte("0123456789abcdef"))
	var m echopb.Echo
	if err := c.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m.Text != "hi" || string(m.Payload) != "0123456789abcdef" || !within(m.Payload, data) {
		t.Errorf("decoded %v (payload in place: %v); want text hi and the payload read in place", &m, within(m.Payload, data))
	}
}

// A handler may answer with the table it received: the codec sends that
// buffer as it is.
func TestReceivedTableIsSentAsItCame(t *testing.T) {
	c := newCodec(t, nil)
	data := buildEcho("forward me", []byte{1, 2, 3})
	var e echofb.Echo
	if err := c.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	out, err := c.Marshal([]byte("hdr"), &e)
	if err != nil || !bytes.Equal(out, append([]byte("hdr"), data...)) {
		t.Errorf("Marshal of a received table = %x, %v; want hdr and the received bytes", out, err)
	}
	if n := c.(kernel.CodecSizer).Size(&e); n != len(data) {
		t.Errorf("Size of a received table = %d, want its buffer's %d", n, len(data))
	}

	// A table that is not the root of its buffer has no buffer of its own.
	var inner echofb.Echo
	inner.Init(data, 0)
	if _, err := c.Marshal(nil, &inner); err == nil || !strings.Contains(err.Error(), "not the root table") {
		t.Errorf("Marshal of a non-root table = %v, want an error saying so", err)
	}
}

func TestMalformedInputIsAnError(t *testing.T) {
	valid := buildEcho("hello", []byte("world"))
	corrupt := func(at int, b byte) []byte {
		d := bytes.Clone(valid)
		d[at] = b
		return d
	}
	root := int(fb.GetUOffsetT(valid))
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"shorter than the root offset", valid[:3]},
		{"root offset past the end", corrupt(3, 0x7f)},
		{"vtable offset past the start", corrupt(root+3, 0x7f)},
		{"truncated", valid[:len(valid)-6]},
	}
	c := newCodec(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, into := range []any{new(echofb.Echo), new(echopb.Echo)} {
				err := c.Unmarshal(tc.data, into)
				if !errors.Is(err, fbverify.ErrMalformed) {
					t.Errorf("Unmarshal into %T = %v, want an error wrapping fbverify.ErrMalformed", into, err)
				}
			}
		})
	}
}

func TestUnsupportedValues(t *testing.T) {
	c := newCodec(t, nil)
	type plain struct{ Text string }
	if _, err := c.Marshal(nil, plain{"x"}); !errors.Is(err, flatbuffers.ErrUnsupported) || !strings.Contains(err.Error(), "flatbuffers_test.plain") {
		t.Errorf("Marshal(plain struct) = %v, want ErrUnsupported naming the type", err)
	}
	if err := c.Unmarshal(buildEcho("", nil), &plain{}); !errors.Is(err, flatbuffers.ErrUnsupported) {
		t.Errorf("Unmarshal into a plain struct = %v, want ErrUnsupported", err)
	}
	if n := c.(kernel.CodecSizer).Size(plain{}); n != 0 {
		t.Errorf("Size(plain struct) = %d, want 0", n)
	}
}

// misuser starts a table inside another, which the builder refuses by
// panicking.
type misuser struct{}

func (misuser) MarshalFlatBuffer(b *fb.Builder) fb.UOffsetT {
	b.StartObject(1)
	b.StartObject(1)
	return b.EndObject()
}

func TestBuilderMisuseIsAnErrorNotAPanic(t *testing.T) {
	c := newCodec(t, nil)
	out, err := c.Marshal([]byte("keep"), misuser{})
	if err == nil || string(out) != "keep" {
		t.Fatalf("Marshal(misuser) = %q, %v; want an error and dst unchanged", out, err)
	}
	if n := c.(kernel.CodecSizer).Size(misuser{}); n != 0 {
		t.Errorf("Size(misuser) = %d, want 0", n)
	}
	// The broken builder was not pooled: the next message encodes cleanly.
	msg := &echopb.Echo{Text: "after", Payload: []byte{1}}
	b, err := c.Marshal(nil, msg)
	var got echopb.Echo
	if err != nil || c.Unmarshal(b, &got) != nil || !proto.Equal(msg, &got) {
		t.Errorf("after a failed Marshal: %v, %v; want %v", &got, err, msg)
	}
}

// Size bounds the encoding from above for every payload and text length, so
// the buffer the kernel asks for is never too small.
func TestSizeIsAnUpperBound(t *testing.T) {
	c := newCodec(t, nil)
	sizer := c.(kernel.CodecSizer)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		msg := &echopb.Echo{Payload: make([]byte, rng.IntN(300)), Text: strings.Repeat("t", rng.IntN(40))}
		if i%7 == 0 {
			msg.Payload = nil
		}
		b, err := c.Marshal(nil, msg)
		if err != nil {
			t.Fatal(err)
		}
		if n := sizer.Size(msg); n < len(b) {
			t.Fatalf("payload %d, text %d: Size = %d < %d encoded", len(msg.Payload), len(msg.Text), n, len(b))
		}
	}
	// A Marshaler without FlatBufferSize is measured by building it.
	if n, want := sizer.Size(onlyMarshaler{"abc"}), len(mustMarshal(t, c, onlyMarshaler{"abc"})); n != want {
		t.Errorf("Size of a Marshaler without FlatBufferSize = %d, want the encoded %d", n, want)
	}
}

type onlyMarshaler struct{ text string }

func (m onlyMarshaler) MarshalFlatBuffer(b *fb.Builder) fb.UOffsetT {
	s := b.CreateString(m.text)
	echofb.EchoStart(b)
	echofb.EchoAddText(b, s)
	return echofb.EchoEnd(b)
}

func mustMarshal(t *testing.T, c kernel.Codec, v any) []byte {
	t.Helper()
	b, err := c.Marshal(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Builders are pooled: encoding into a buffer that fits allocates nothing.
func TestMarshalIntoABufferThatFitsDoesNotAllocate(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("the race detector drops pooled builders on purpose")
	}
	c := newCodec(t, nil)
	msg := &echopb.Echo{Text: "hello", Payload: bytes.Repeat([]byte{7}, 64<<10)}
	buf := make([]byte, 0, c.(kernel.CodecSizer).Size(msg))
	mustMarshal(t, c, msg) // grow a pooled builder once
	allocs := testing.AllocsPerRun(200, func() {
		if out, err := c.Marshal(buf[:0], msg); err != nil || len(out) == 0 {
			t.Fatal(err)
		}
	})
	// sync.Pool may drop a builder at a GC; AllocsPerRun averages that away.
	if allocs >= 1 {
		t.Errorf("Marshal of a 64 KiB echo: %.1f allocations per call, want 0", allocs)
	}
}

// FuzzUnmarshal checks that no input makes Unmarshal, or reading the fields
// of what it accepted, panic, into a generated table and into echopb.Echo;
// and that what it accepts survives a round trip.
func FuzzUnmarshal(f *testing.F) {
	f.Add(buildEcho("hello", []byte("world")))
	f.Add(buildEcho("", nil))
	f.Add(buildEcho("Zoë ✓", bytes.Repeat([]byte{0xff}, 100)))
	c := newCodec(f, nil)
	f.Add(mustMarshalF(f, c, &echopb.Echo{}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var e echofb.Echo
		if c.Unmarshal(data, &e) == nil {
			text, payload := e.Text(), e.PayloadBytes()
			for j := range e.PayloadLength() {
				if e.Payload(j) != payload[j] {
					t.Fatalf("Payload(%d) disagrees with PayloadBytes", j)
				}
			}
			again := buildEcho(string(text), payload)
			var e2 echofb.Echo
			if err := c.Unmarshal(again, &e2); err != nil || !bytes.Equal(e2.Text(), text) || !bytes.Equal(e2.PayloadBytes(), payload) {
				t.Fatalf("re-encoded table does not read back: %v", err)
			}
		}
		var m echopb.Echo
		if c.Unmarshal(data, &m) == nil {
			b, err := c.Marshal(nil, &m)
			if err != nil {
				t.Fatalf("re-Marshal of accepted message: %v", err)
			}
			var again echopb.Echo
			if err := c.Unmarshal(b, &again); err != nil || again.Text != m.Text || !bytes.Equal(again.Payload, m.Payload) {
				t.Fatalf("round trip of a message: %v then %v (%v)", &m, &again, err)
			}
		}
	})
}

func mustMarshalF(f *testing.F, c kernel.Codec, v any) []byte {
	b, err := c.Marshal(nil, v)
	if err != nil {
		f.Fatal(err)
	}
	return b
}
