package protobuf

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

func TestRegisteredUnderName(t *testing.T) {
	c, err := kernel.NewCodec(Name, nil, "test")
	if err != nil {
		t.Fatalf("NewCodec(%q): %v", Name, err)
	}
	if c.Name() != Name {
		t.Errorf("Name() = %q, want %q", c.Name(), Name)
	}
	if _, ok := c.(kernel.CodecSizer); !ok {
		t.Errorf("codec %T does not implement kernel.CodecSizer", c)
	}
	if _, err := kernel.NewCodec(Name, map[string]any{"level": 1}, "test.yaml"); err == nil {
		t.Errorf("options given to a codec that takes none: want an error, got nil")
	}
}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		msg  *echopb.Echo
	}{
		{"empty message encodes to nothing and back", &echopb.Echo{}},
		{"text only", &echopb.Echo{Text: "hello, kernrpc"}},
		{"payload only", &echopb.Echo{Payload: []byte{0, 1, 2, 0xff}}},
		{"both fields, large payload", &echopb.Echo{Text: "big", Payload: bytes.Repeat([]byte("x"), 1<<20)}},
	}
	var c Codec
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := c.Marshal(nil, tc.msg)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if got, want := len(b), c.Size(tc.msg); got != want {
				t.Errorf("len(Marshal) = %d, Size = %d; want them equal", got, want)
			}
			got := &echopb.Echo{Text: "stale field from a reused message"}
			if err := c.Unmarshal(b, got); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(got, tc.msg) {
				t.Errorf("round trip: got %v, want %v", got, tc.msg)
			}
		})
	}
}

func TestMarshalAppendsWithoutClobbering(t *testing.T) {
	var c Codec
	prefix := []byte("frame-header")
	dst := make([]byte, len(prefix), 256)
	copy(dst, prefix)
	msg := &echopb.Echo{Text: "body", Payload: []byte{9, 9}}

	out, err := c.Marshal(dst, msg)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if !bytes.Equal(out[:len(prefix)], prefix) {
		t.Errorf("existing bytes changed: got %q, want %q", out[:len(prefix)], prefix)
	}
	if &out[0] != &dst[0] {
		t.Errorf("Marshal reallocated although dst had room for %d bytes", cap(dst)-len(dst))
	}
	want, _ := proto.Marshal(msg)
	if !bytes.Equal(out[len(prefix):], want) {
		t.Errorf("appended bytes = %x, want %x", out[len(prefix):], want)
	}

	// Too small a dst: the result grows, the prefix is still there.
	small := []byte("hdr")
	out, err = c.Marshal(small[:len(small):len(small)], msg)
	if err != nil {
		t.Fatalf("Marshal into full dst: %v", err)
	}
	if string(out[:3]) != "hdr" || !bytes.Equal(out[3:], want) {
		t.Errorf("Marshal into full dst = %q, want %q + encoding", out, "hdr")
	}
}

func TestBadInputIsAnErrorNotAPanic(t *testing.T) {
	valid, _ := proto.Marshal(&echopb.Echo{Text: "hello", Payload: []byte("world")})
	cases := []struct {
		name string
		data []byte
	}{
		{"truncated length-delimited field", valid[:len(valid)-2]},
		{"tag with no value", []byte{0x0a}},
		{"length past the end", []byte{0x0a, 0x7f, 'a'}},
		{"field number zero", []byte{0x00, 0x01}},
		{"unterminated varint", []byte{0x08, 0xff, 0xff, 0xff}},
		{"end-group wire type with no group", []byte{0x0c}},
	}
	var c Codec
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m echopb.Echo
			err := c.Unmarshal(tc.data, &m)
			if err == nil {
				t.Fatalf("Unmarshal(%x) succeeded with %v; want an error", tc.data, &m)
			}
			if !strings.HasPrefix(err.Error(), "protobuf: unmarshal") || !strings.Contains(err.Error(), "*echopb.Echo") {
				t.Errorf("error %q does not say it is the protobuf codec unmarshalling into *echopb.Echo", err)
			}
		})
	}
}

// Messages without vtprotobuf methods take protobuf-go's reflective path,
// which also checks UTF-8 (the vtprotobuf methods do not).
func TestMessagesWithoutVTMethods(t *testing.T) {
	var c Codec
	in := wrapperspb.Bytes(bytes.Repeat([]byte{1, 2, 3}, 1000))
	b, err := c.Marshal([]byte("hdr"), in)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(in)
	if !bytes.Equal(b[3:], want) || c.Size(in) != len(want) {
		t.Errorf("Marshal = %x... (Size %d), want proto.Marshal's %x... (%d bytes)", b[3:min(len(b), 10)], c.Size(in), want[:7], len(want))
	}
	got := wrapperspb.Bytes([]byte("stale"))
	if err := c.Unmarshal(b[3:], got); err != nil || !proto.Equal(got, in) {
		t.Errorf("Unmarshal = %v, equal %v; want the message back", err, proto.Equal(got, in))
	}
	err = c.Unmarshal([]byte{0x0a, 0x02, 0xff, 0xfe}, new(wrapperspb.StringValue))
	if err == nil || !strings.Contains(err.Error(), "*wrapperspb.StringValue") {
		t.Errorf("invalid UTF-8 in a string field: err = %v, want an error naming *wrapperspb.StringValue", err)
	}
}

// echopb.Echo has vtprotobuf methods: the codec's encoding must be
// protobuf-go's, byte for byte, so either side may use either path.
func TestVTMethodsEncodeAsProtobufGoDoes(t *testing.T) {
	var c Codec
	for _, m := range []*echopb.Echo{{}, {Text: "t"}, {Payload: []byte{0}}, {Text: "both", Payload: bytes.Repeat([]byte{9}, 300)}} {
		got, err := c.Marshal(nil, m)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if !bytes.Equal(got, want) || c.Size(m) != len(want) {
			t.Errorf("%v: Marshal = %x (Size %d), want %x", m, got, c.Size(m), want)
		}
	}
}

func TestDecodeIntoAReusedMessageReusesItsPayload(t *testing.T) {
	for name, c := range map[string]Codec{"zero Codec": {}, "New's": {types: new(typeFacts)}} {
		big, _ := proto.Marshal(&echopb.Echo{Payload: bytes.Repeat([]byte{7}, 64<<10)})
		var m echopb.Echo
		if err := c.Unmarshal(big, &m); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if err := c.Unmarshal(big, &m); err != nil || len(m.Payload) != 64<<10 {
				t.Fatalf("%s: Unmarshal: %v, %d bytes", name, err, len(m.Payload))
			}
		})
		if allocs != 0 {
			t.Errorf("%s: decoding 64 KiB into a reused message: %.1f allocations, want 0", name, allocs)
		}
		// Reuse must not leak the previous contents.
		small, _ := proto.Marshal(&echopb.Echo{Text: "only text"})
		if err := c.Unmarshal(small, &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Payload) != 0 || m.Text != "only text" {
			t.Errorf("%s: after decoding a message without payload: text %q, %d payload bytes; want the payload gone", name, m.Text, len(m.Payload))
		}
	}
}

func TestAliasRequests(t *testing.T) {
	plain, err := kernel.NewCodec(Name, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.(kernel.InPlaceUnmarshaler); ok {
		t.Errorf("the default codec decodes in place; it must copy unless alias_requests is on")
	}
	c, err := kernel.NewCodec(Name, map[string]any{"alias_requests": true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	d, ok := c.(kernel.InPlaceUnmarshaler)
	if !ok || c.Name() != Name {
		t.Fatalf("with alias_requests: %T named %q, want a kernel.InPlaceUnmarshaler named %q", c, c.Name(), Name)
	}
	data, _ := proto.Marshal(&echopb.Echo{Text: "in place", Payload: []byte("0123456789")})
	var m echopb.Echo
	if err := d.UnmarshalInPlace(data, &m); err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(data, m.Payload); m.Text != "in place" || i < 0 || &data[i] != &m.Payload[0] {
		t.Errorf("UnmarshalInPlace: text %q, payload %q not inside the input; want it to point into the input", m.Text, m.Payload)
	}
	// A message without UnmarshalVTUnsafe is decoded by copying.
	data, _ = proto.Marshal(wrapperspb.Bytes([]byte("copied")))
	var w wrapperspb.BytesValue
	if err := d.UnmarshalInPlace(data, &w); err != nil || string(w.Value) != "copied" {
		t.Fatalf("UnmarshalInPlace into a message without vtprotobuf methods: %v, %q", err, w.Value)
	}
	if &w.Value[0] == &data[len(data)-len(w.Value)] {
		t.Errorf("a message without UnmarshalVTUnsafe points into its input")
	}
	if err := d.UnmarshalInPlace([]byte{0x0a, 0x7f, 'a'}, &m); err == nil || !strings.Contains(err.Error(), "*echopb.Echo") {
		t.Errorf("UnmarshalInPlace of a truncated message: %v, want an error naming *echopb.Echo", err)
	}
	if err := d.UnmarshalInPlace(data, (*echopb.Echo)(nil)); err == nil {
		t.Errorf("UnmarshalInPlace into a nil message: no error")
	}
	_, err = kernel.NewCodec(Name, map[string]any{"alias_requests": "yes"}, "svc.yaml")
	if err == nil || !strings.Contains(err.Error(), "alias_requests") || !strings.Contains(err.Error(), "svc.yaml") {
		t.Errorf("alias_requests: \"yes\": err = %v, want an error naming the key and the file", err)
	}
}

func TestNilMessage(t *testing.T) {
	var c Codec
	var m *echopb.Echo
	if err := c.Unmarshal([]byte{0x12, 1, 'a'}, m); err == nil || !strings.Contains(err.Error(), "nil *echopb.Echo") {
		t.Errorf("Unmarshal into a nil *echopb.Echo = %v, want an error naming it (not a panic)", err)
	}
	b, err := c.Marshal([]byte("x"), m)
	if err != nil || string(b) != "x" || c.Size(m) != 0 {
		t.Errorf("Marshal(nil message) = %q, %v (size %d); want it to encode as the empty message", b, err, c.Size(m))
	}
}

func TestNotAMessage(t *testing.T) {
	type plain struct{ Text string }
	var c Codec
	cases := []struct {
		name string
		call func() error
		typ  string
	}{
		{"marshal a plain struct", func() error { _, err := c.Marshal(nil, plain{"x"}); return err }, "protobuf.plain"},
		{"marshal a pointer to a plain struct", func() error { _, err := c.Marshal(nil, &plain{"x"}); return err }, "*protobuf.plain"},
		{"marshal nil", func() error { _, err := c.Marshal(nil, nil); return err }, "<nil>"},
		{"unmarshal into a plain struct", func() error { return c.Unmarshal([]byte{}, &plain{}) }, "*protobuf.plain"},
		{"unmarshal into a string", func() error { var s string; return c.Unmarshal(nil, &s) }, "*string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("want an error, got nil")
			}
			if !errors.Is(err, ErrNotMessage) {
				t.Errorf("error %q does not wrap ErrNotMessage", err)
			}
			for _, want := range []string{tc.typ, "json", "msgpack"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	if got := c.Size(plain{}); got != 0 {
		t.Errorf("Size(plain struct) = %d, want 0", got)
	}
	if out, _ := c.Marshal([]byte("keep"), plain{}); string(out) != "keep" {
		t.Errorf("failed Marshal returned %q, want dst unchanged %q", out, "keep")
	}
}

func TestMarshalIntoBigEnoughBufferDoesNotAllocate(t *testing.T) {
	var c Codec
	msg := &echopb.Echo{Text: "hello", Payload: bytes.Repeat([]byte{7}, 512)}
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(1000, func() {
		out, err := c.Marshal(buf[:0], msg)
		if err != nil || len(out) == 0 {
			t.Fatalf("Marshal: %v", err)
		}
	})
	if allocs != 0 {
		t.Errorf("Marshal into a big-enough buffer: %.1f allocations per call, want 0", allocs)
	}
	allocs = testing.AllocsPerRun(1000, func() { _ = c.Size(msg) })
	if allocs != 0 {
		t.Errorf("Size: %.1f allocations per call, want 0", allocs)
	}
}

func TestConcurrentUse(t *testing.T) {
	var c Codec // one value shared by every goroutine, as the kernel does
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			buf := make([]byte, 0, 64)
			for i := range 500 {
				in := &echopb.Echo{Text: strings.Repeat("g", g), Payload: []byte{byte(i)}}
				var err error
				buf, err = c.Marshal(buf[:0], in)
				if err != nil {
					t.Errorf("Marshal: %v", err)
					return
				}
				var out echopb.Echo
				if err := c.Unmarshal(buf, &out); err != nil {
					t.Errorf("Unmarshal: %v", err)
					return
				}
				if !proto.Equal(in, &out) {
					t.Errorf("goroutine %d call %d: got %v, want %v", g, i, &out, in)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzUnmarshal checks that no input makes Unmarshal panic, that what it
// accepts survives a round trip, and that the vtprotobuf path (echopb.Echo
// has the methods) agrees with protobuf-go's own decoder, in place or not.
// Seeds live in testdata/fuzz/FuzzUnmarshal.
func FuzzUnmarshal(f *testing.F) {
	for _, m := range []*echopb.Echo{{}, {Text: "hi"}, {Payload: []byte{0, 1, 2}}, {Text: "both", Payload: []byte("x")}} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x7f})
	var c Codec
	var inPlace aliasingCodec
	f.Fuzz(func(t *testing.T, data []byte) {
		var m echopb.Echo
		err := c.Unmarshal(data, &m)
		var ref echopb.Echo
		refErr := proto.Unmarshal(data, &ref)
		switch {
		case err == nil && refErr == nil:
			if !equalKnownFields(&m, &ref) {
				t.Fatalf("protobuf-go decodes %x to %v; the codec to %v", data, &ref, &m)
			}
		case err == nil && !strings.Contains(refErr.Error(), "invalid UTF-8"):
			t.Fatalf("the codec accepts %x as %v; protobuf-go refuses it (%v), and not for UTF-8", data, &m, refErr)
		case refErr == nil && !strings.Contains(err.Error(), "wrong wireType"):
			// The documented difference: vtprotobuf refuses a known field
			// with another wire type, where protobuf-go keeps it unknown.
			t.Fatalf("protobuf-go decodes %x to %v; the codec refuses it: %v", data, &ref, err)
		}
		var aliased echopb.Echo
		if aErr := inPlace.UnmarshalInPlace(data, &aliased); (aErr == nil) != (err == nil) || (err == nil && !proto.Equal(&aliased, &m)) {
			t.Fatalf("in place: %v, %v; copying: %v, %v", &aliased, aErr, &m, err)
		}
		if err != nil {
			return
		}
		b, err := c.Marshal(nil, &m)
		if err != nil {
			t.Fatalf("re-Marshal of an accepted input failed: %v", err)
		}
		var again echopb.Echo
		if err := c.Unmarshal(b, &again); err != nil {
			t.Fatalf("Unmarshal of our own encoding %x failed: %v", b, err)
		}
		if !proto.Equal(&m, &again) {
			t.Fatalf("round trip changed the message: %v then %v", &m, &again)
		}
	})
}

// equalKnownFields compares two messages without their unknown fields,
// which the two decoders may keep byte-for-byte differently (protobuf-go
// and vtprotobuf differ on non-minimal tag encodings).
func equalKnownFields(a, b *echopb.Echo) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.ProtoReflect().SetUnknown(nil)
	b.ProtoReflect().SetUnknown(nil)
	return proto.Equal(a, b)
}
