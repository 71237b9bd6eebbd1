package protobuf_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/presencepb"
)

// vtprotobuf's decoders keep, as unknown fields, field numbers above the
// largest protobuf allows, at any depth; protobuf-go refuses them. The
// codec must refuse them wherever they are, not only at the top level:
// such a message fails later, far from its cause (printing it panics,
// re-encoding sends the bytes on).
func TestUnmarshalRefusesNestedFieldNumbersOutOfRange(t *testing.T) {
	bad := protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType)
	bad = protowire.AppendVarint(bad, 1)
	inner := func(num protowire.Number, body []byte) []byte { // Inner or Outer, field num holding body
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), body)
	}
	entry := append(inner(1, []byte("k")), inner(2, bad)...) // a by_name map entry whose value is bad
	for name, data := range map[string][]byte{
		"top level":          bad,
		"inner":              inner(2, bad),
		"inner.next":         inner(2, inner(2, bad)),
		"items[1]":           append(inner(3, nil), inner(3, bad)...),
		"by_name value":      inner(4, entry),
		"oneof picked":       inner(5, bad),
		"items[0].next.next": inner(3, inner(2, inner(2, bad))),
	} {
		if err := proto.Unmarshal(data, new(presencepb.Outer)); err == nil {
			t.Fatalf("%s: protobuf-go accepts %x; the test's premise is wrong", name, data)
		}
		fresh := namedCodec{"UnmarshalFresh", func(b []byte, v any) error {
			return protobuf.Codec{}.UnmarshalFresh(b, v)
		}}
		for _, c := range append(codecs(t), fresh) {
			err := c.decode(data, new(presencepb.Outer))
			if err == nil || !strings.Contains(err.Error(), "out of range") {
				t.Errorf("%s: %s of %x = %v; want an error saying the field number is out of range", name, c.name, data, err)
			}
		}
	}
}

// A message nested deeper than protobuf-go's recursion limit is refused,
// as protobuf-go refuses it; one nested exactly that deep is not.
func TestUnmarshalRefusesMessagesNestedTooDeep(t *testing.T) {
	nest := func(depth int) []byte {
		var data []byte
		for range depth {
			data = protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), data)
		}
		return data
	}
	// protobuf-go counts the outermost message as one level.
	atLimit, tooDeep := nest(protowire.DefaultRecursionLimit-1), nest(protowire.DefaultRecursionLimit)
	if proto.Unmarshal(atLimit, new(presencepb.Inner)) != nil || proto.Unmarshal(tooDeep, new(presencepb.Inner)) == nil {
		t.Fatal("protobuf-go's limit is not where the test expects it")
	}
	for _, c := range codecs(t) {
		if err := c.decode(atLimit, new(presencepb.Inner)); err != nil {
			t.Errorf("%s of a message nested as deep as protobuf-go allows: %v", c.name, err)
		}
		if err := c.decode(tooDeep, new(presencepb.Inner)); err == nil || !strings.Contains(err.Error(), "depth") {
			t.Errorf("%s of a message nested one deeper = %v; want an error naming the depth", c.name, err)
		}
	}
}

type namedCodec struct {
	name   string
	decode func([]byte, any) error
}

// codecs returns the decoders that reset the message first: Unmarshal,
// and UnmarshalInPlace with alias_requests.
func codecs(t *testing.T) []namedCodec {
	t.Helper()
	aliasing, err := protobuf.New(&protobuf.Options{AliasRequests: true})
	if err != nil {
		t.Fatal(err)
	}
	inPlace := aliasing.(interface{ UnmarshalInPlace([]byte, any) error })
	plain, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	return []namedCodec{
		{"Unmarshal", plain.Unmarshal},
		{"UnmarshalInPlace", inPlace.UnmarshalInPlace},
		{"zero Codec's Unmarshal", protobuf.Codec{}.Unmarshal},
	}
}

func decode(t *testing.T, c namedCodec, from, into proto.Message) {
	t.Helper()
	data, err := proto.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.decode(data, into); err != nil {
		t.Fatalf("%s of %v: %v", c.name, from, err)
	}
}

// BenchmarkUnmarshalVT decodes through vtprotobuf's methods: a 16 B echo
// (no message fields, nothing to walk) and a message holding others,
// whose unknown fields are parsed at every depth.
func BenchmarkUnmarshalVT(b *testing.B) {
	c, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	fresh := c.(interface{ UnmarshalFresh([]byte, any) error })
	small, _ := proto.Marshal(&echopb.Echo{Payload: make([]byte, 16)})
	nested, _ := proto.Marshal(&presencepb.Outer{
		Inner: &presencepb.Inner{Data: make([]byte, 16), Next: &presencepb.Inner{}},
		Items: []*presencepb.Inner{{Data: make([]byte, 16)}, {Data: make([]byte, 16)}},
	})
	b.Run("echo16B/Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		m := new(echopb.Echo)
		for b.Loop() {
			if err := c.Unmarshal(small, m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("echo16B/UnmarshalFresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := fresh.UnmarshalFresh(small, new(echopb.Echo)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("nested/UnmarshalFresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := fresh.UnmarshalFresh(nested, new(presencepb.Outer)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzUnmarshalNested is FuzzUnmarshal for messages that hold messages in
// every container. What the codec accepts, into a reused message,
// protobuf-go accepts too (but for invalid UTF-8) and decodes alike, and
// it re-encodes into bytes protobuf-go accepts. The other way round is not
// checked: vtprotobuf refuses a known field sent with another wire type in
// more ways than FuzzUnmarshal tells apart (a map entry's value reads a
// length anyway and reports EOF). Seeds live in
// testdata/fuzz/FuzzUnmarshalNested.
func FuzzUnmarshalNested(f *testing.F) {
	for _, m := range []*presencepb.Outer{
		{Data: []byte{}, Inner: &presencepb.Inner{Next: &presencepb.Inner{Data: []byte("n")}}},
		{Items: []*presencepb.Inner{{}, {Data: []byte("i")}}, ByName: map[string]*presencepb.Inner{"k": {}}},
		{Choice: &presencepb.Outer_Picked{Picked: &presencepb.Inner{}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	c, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		f.Fatal(err)
	}
	reused := new(presencepb.Outer)
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := c.Unmarshal(data, reused); err != nil {
			return
		}
		again, err := proto.Marshal(reused)
		switch {
		case err != nil && strings.Contains(err.Error(), "invalid UTF-8"):
			return // vtprotobuf checks no strings: the documented difference
		case err != nil:
			t.Fatalf("the codec accepts %x as %v, which protobuf-go cannot encode: %v", data, reused, err)
		}
		if err := proto.Unmarshal(again, new(presencepb.Outer)); err != nil && !strings.Contains(err.Error(), "invalid UTF-8") {
			t.Fatalf("the codec accepts %x as %v, whose encoding %x protobuf-go refuses: %v", data, reused, again, err)
		}
		var ref presencepb.Outer
		switch refErr := proto.Unmarshal(data, &ref); {
		case refErr == nil:
			if a, b := knownOnly(reused), knownOnly(&ref); !proto.Equal(a, b) {
				t.Fatalf("protobuf-go decodes %x to %v; the codec, into a reused message, to %v", data, b, a)
			}
		case !strings.Contains(refErr.Error(), "invalid UTF-8"):
			t.Fatalf("the codec accepts %x as %v; protobuf-go refuses it: %v", data, reused, refErr)
		}
	})
}

// knownOnly returns a copy of m without unknown fields, at any depth: the
// two decoders may keep their bytes differently.
func knownOnly(m *presencepb.Outer) proto.Message {
	b, _ := proto.Marshal(m)
	var out presencepb.Outer
	_ = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &out)
	return &out
}

// vtprotobuf reads a map entry's key and value whatever their wire type
// says, so a key sent as a varint has its tag's value read as a string's
// length: another key than the one sent, where protobuf-go skips the
// field. The codec refuses such an entry, as vtprotobuf refuses an
// ordinary field with another wire type, for a map of messages and of
// strings alike.
func TestUnmarshalRefusesAMapEntryFieldOfAnotherWireType(t *testing.T) {
	entry := []byte{0x08, 0x03, 'a', 'b', 'c'} // key (field 1) as a varint 3, then "abc"
	for name, num := range map[string]protowire.Number{"by_name": 4, "tags": 7} {
		data := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), entry)
		for _, c := range codecs(t) {
			if err := c.decode(data, new(presencepb.Outer)); err == nil || !strings.Contains(err.Error(), "wire type") {
				t.Errorf("%s: %s of an entry whose key is a varint = %v; want an error naming the wire type", name, c.name, err)
			}
		}
	}
}
