package msgpack_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	vmsgpack "github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/msgpack"
)

// reading is a plain Go struct of the kind the codec is for: tags rename and
// omit fields, and it nests a struct, a map, bytes and a time.
type reading struct {
	Sensor  string            `msgpack:"sensor"`
	Values  []float64         `msgpack:"values"`
	Tags    map[string]string `msgpack:"tags,omitempty"`
	Raw     []byte            `msgpack:"raw,omitempty"`
	At      time.Time         `msgpack:"at"`
	Where   location          `msgpack:"where"`
	Scratch string            `msgpack:"-"`
	Count   int
}

type location struct {
	Lat, Lon float64
}

func newCodec(t testing.TB, options map[string]any) kernel.Codec {
	t.Helper()
	c, err := msgpack.Factory.Build(options, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRegisteredUnderName(t *testing.T) {
	c, err := kernel.NewCodec(msgpack.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewCodec(%q): %v", msgpack.Name, err)
	}
	if c.Name() != "msgpack" {
		t.Errorf("Name() = %q, want msgpack", c.Name())
	}
}

func TestStructTagsHonoured(t *testing.T) {
	c := newCodec(t, nil)
	b, err := c.Marshal(nil, reading{Sensor: "t1", Scratch: "not sent", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := vmsgpack.Unmarshal(b, &fields); err != nil {
		t.Fatalf("output is not one MessagePack map: %v", err)
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	for _, want := range []string{"sensor", "values", "at", "where", "Count"} {
		if _, ok := fields[want]; !ok {
			t.Errorf("encoded keys %v lack %q", keys, want)
		}
	}
	for _, unwanted := range []string{"Sensor", "Scratch", "tags", "raw"} {
		if _, ok := fields[unwanted]; ok {
			t.Errorf("encoded keys %v hold %q (renamed, msgpack:\"-\" or omitempty)", keys, unwanted)
		}
	}
	if fields["sensor"] != "t1" {
		t.Errorf("sensor = %v, want t1", fields["sensor"])
	}
}

func TestUnknownFields(t *testing.T) {
	in, err := vmsgpack.Marshal(map[string]any{"sensor": "t1", "colour": "red"})
	if err != nil {
		t.Fatal(err)
	}
	err = newCodec(t, nil).Unmarshal(in, new(reading))
	if err == nil || !strings.Contains(err.Error(), "colour") || !strings.Contains(err.Error(), "discard_unknown") {
		t.Errorf("by default: err = %v, want an error naming the field and the option that accepts it", err)
	}
	var r reading
	if err := newCodec(t, map[string]any{"discard_unknown": true}).Unmarshal(in, &r); err != nil || r.Sensor != "t1" {
		t.Errorf("with discard_unknown: %+v, %v; want sensor t1 and the unknown field ignored", r, err)
	}
}

func TestOneValueOnly(t *testing.T) {
	c := newCodec(t, nil)
	one, err := c.Marshal(nil, reading{Sensor: "a"})
	if err != nil {
		t.Fatal(err)
	}
	two := append(append([]byte(nil), one...), one...)
	if err := c.Unmarshal(two, new(reading)); !errors.Is(err, msgpack.ErrTrailingData) {
		t.Errorf("two values: err = %v, want ErrTrailingData", err)
	}
	if err := c.Unmarshal(nil, new(reading)); err == nil {
		t.Error("empty input decoded; want an error")
	}
}

// A reused value keeps nothing from before, as with the protobuf codec.
func TestUnmarshalReplacesTheValue(t *testing.T) {
	c := newCodec(t, nil)
	in, err := c.Marshal(nil, map[string]any{"sensor": "new", "tags": map[string]string{"new": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	r := &reading{Count: 9, Tags: map[string]string{"stale": "1"}, Values: []float64{1}}
	if err := c.Unmarshal(in, r); err != nil {
		t.Fatal(err)
	}
	want := &reading{Sensor: "new", Tags: map[string]string{"new": "1"}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("decoded into a used value: %+v, want %+v", r, want)
	}
}

func TestProtobufMessagesByExportedFields(t *testing.T) {
	c := newCodec(t, nil)
	in := &echopb.Echo{Text: "hi", Payload: []byte{1, 2}}
	b, err := c.Marshal(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	var out echopb.Echo
	if err := c.Unmarshal(b, &out); err != nil || !proto.Equal(in, &out) {
		t.Errorf("round trip of %v: %v, %v", in, &out, err)
	}
}

func TestMarshalAppends(t *testing.T) {
	c := newCodec(t, nil)
	dst := append(make([]byte, 0, 256), "hdr"...)
	out, err := c.Marshal(dst, reading{Sensor: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out, []byte("hdr")) || &out[0] != &dst[0] {
		t.Errorf("Marshal = %q; want the encoding appended in place after \"hdr\"", out)
	}
	if out, err := c.Marshal(dst, make(chan int)); err == nil || string(out) != "hdr" {
		t.Errorf("Marshal(chan) = %q, %v; want an error and dst unchanged", out, err)
	}
}

// FuzzUnmarshal checks that no input panics Unmarshal, into a struct or into
// a protobuf message, and that what it accepts survives a round trip.
func FuzzUnmarshal(f *testing.F) {
	c := newCodec(f, nil)
	for _, v := range []any{
		reading{Sensor: "s", Values: []float64{1, 2.5}, Tags: map[string]string{"k": "v"}, Raw: []byte{0, 1}, At: time.Unix(1700000000, 5).UTC(), Count: -1},
		&echopb.Echo{Text: "hi", Payload: []byte{0, 1, 2}},
		map[string]any{"sensor": 7},
	} {
		b, err := c.Marshal(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xc6, 0x7f, 0xff, 0xff, 0xff}) // bin32 claiming 2 GiB
	f.Add([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff}) // array32 claiming 2^31 elements
	f.Fuzz(func(t *testing.T, data []byte) {
		var r reading
		if c.Unmarshal(data, &r) == nil {
			b, err := c.Marshal(nil, &r)
			if err != nil {
				t.Fatalf("re-Marshal of accepted value %+v: %v", r, err)
			}
			var again reading
			if err := c.Unmarshal(b, &again); err != nil {
				t.Fatalf("Unmarshal of our own encoding %x: %v", b, err)
			}
			if b2, _ := c.Marshal(nil, &again); !bytes.Equal(b, b2) {
				t.Fatalf("round trip changed the value: %+v then %+v", r, again)
			}
		}
		var m echopb.Echo
		if c.Unmarshal(data, &m) == nil {
			b, err := c.Marshal(nil, &m)
			if err != nil {
				t.Fatalf("re-Marshal of accepted message %v: %v", &m, err)
			}
			var again echopb.Echo
			if err := c.Unmarshal(b, &again); err != nil || !proto.Equal(&m, &again) {
				t.Fatalf("round trip of a message: %v then %v (%v)", &m, &again, err)
			}
		}
	})
}

// A length claims what the input cannot hold: the codec refuses it before
// the library sizes anything by it. (The fuzzer found the library
// allocating tens of gigabytes for the 13 bytes of the first case.)
func TestClaimedLengthsCannotOutgrowTheInput(t *testing.T) {
	cases := map[string][]byte{
		"array32 of floats":      {0x81, 0xa6, 'v', 'a', 'l', 'u', 'e', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff},
		"map32 of strings":       {0x81, 0xa4, 't', 'a', 'g', 's', 0xdf, 0x7f, 0xff, 0xff, 0xff},
		"array16 past the end":   {0x81, 0xa6, 'v', 'a', 'l', 'u', 'e', 's', 0xdc, 0x00, 0x03, 0xcb},
		"str32 of 4 GiB":         {0x81, 0xa6, 's', 'e', 'n', 's', 'o', 'r', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'},
		"bin32 of 2 GiB":         {0x81, 0xa3, 'r', 'a', 'w', 0xc6, 0x7f, 0xff, 0xff, 0xff},
		"ext32 of 4 GiB":         {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},
		"length cut short":       {0xdd, 0x00},
		"never-used format":      {0xc1},
		"nested 10001 deep":      append(bytes.Repeat([]byte{0x91}, 10001), 0xc0),
		"value missing in a map": {0x81, 0xa6, 's', 'e', 'n', 's', 'o', 'r'},
	}
	for _, opts := range []map[string]any{nil, {"discard_unknown": true}} {
		c := newCodec(t, opts)
		for name, in := range cases {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			err := c.Unmarshal(in, new(reading))
			runtime.ReadMemStats(&ms)
			if !errors.Is(err, msgpack.ErrMalformed) {
				t.Errorf("%s (options %v): err = %v, want ErrMalformed", name, opts, err)
			}
			if grew := ms.TotalAlloc - before; grew > 1<<20 {
				t.Errorf("%s (options %v): %d bytes of input made it allocate %d bytes", name, opts, len(in), grew)
			}
		}
	}
	// Deep, but within the limit, still decodes.
	var deep any
	if err := newCodec(t, nil).Unmarshal(append(bytes.Repeat([]byte{0x91}, 1000), 0xc0), &deep); err != nil {
		t.Errorf("1000 nested arrays: %v", err)
	}
}

// keyed holds maps keyed by interface{}, which the library fills with
// whatever a key decodes to: an array, a map or bytes decode to values Go
// cannot hash. Named is an interface with methods, which nothing the
// library decodes implements (a protobuf oneof is such a field).
type keyed struct {
	Any   map[any]any    `msgpack:"any"`
	Name  map[any]string `msgpack:"name"`
	Named fmt.Stringer   `msgpack:"named"`
}

// A peer's bytes are an error, never a panic: the server decodes requests
// outside the handler's recover, so a panic there ends the process.
func TestInputTheLibraryPanicsOnIsAnError(t *testing.T) {
	oneof, err := newCodec(t, nil).Marshal(nil, structpb.NewStringValue("x"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		in   []byte
		into func() any
	}{
		{"array key", []byte{0x81, 0xa3, 'a', 'n', 'y', 0x81, 0x90, 0xc0}, func() any { return new(keyed) }},
		{"map key", []byte{0x81, 0xa3, 'a', 'n', 'y', 0x82, 0x01, 0xc0, 0x80, 0xc0}, func() any { return new(keyed) }},
		{"bin key", []byte{0x81, 0xa4, 'n', 'a', 'm', 'e', 0x81, 0xc4, 0x01, 0x00, 0xa1, 'x'}, func() any { return new(keyed) }},
		{"nested key", []byte{0x81, 0xa3, 'a', 'n', 'y', 0x81, 0x91, 0x90, 0xc0}, func() any { return new(keyed) }},
		{"string into an interface with methods", []byte{0x81, 0xa5, 'n', 'a', 'm', 'e', 'd', 0xa1, 'x'}, func() any { return new(keyed) }},
		{"a oneof, as the codec encodes it", oneof, func() any { return new(structpb.Value) }},
	}
	for _, opts := range []map[string]any{nil, {"discard_unknown": true}} {
		c := newCodec(t, opts)
		for _, tc := range cases {
			into := tc.into()
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s (options %v): Unmarshal(%x) into %T panicked: %v", tc.name, opts, tc.in, into, p)
					}
				}()
				err = c.Unmarshal(tc.in, into)
			}()
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%T", into)) {
				t.Errorf("%s (options %v): Unmarshal(%x) into %T = %v; want an error naming the type", tc.name, opts, tc.in, into, err)
			}
		}
		// The codec still decodes after the refused inputs.
		in, err := c.Marshal(nil, keyed{Any: map[any]any{"a": int8(1)}, Name: map[any]string{int8(2): "b"}})
		if err != nil {
			t.Fatal(err)
		}
		var got keyed
		if err := c.Unmarshal(in, &got); err != nil || got.Any["a"] != int8(1) || got.Name[int8(2)] != "b" {
			t.Errorf("options %v: after the refused inputs: %+v, %v; want the value back", opts, got, err)
		}
	}
}

// New takes the options as they are when it is called: a caller that
// builds two codecs from one Options value, changing it in between, gets
// two codecs that keep their own settings.
func TestNewKeepsItsOptions(t *testing.T) {
	o := msgpack.DefaultOptions()
	strict, err := msgpack.New(o)
	if err != nil {
		t.Fatal(err)
	}
	o.DiscardUnknown = true
	if _, err := msgpack.New(o); err != nil {
		t.Fatal(err)
	}
	in, err := vmsgpack.Marshal(map[string]any{"sensor": "t1", "colour": "red"})
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Unmarshal(in, new(reading)); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("a codec built with discard_unknown false, after its Options changed: err = %v, want the unknown field refused", err)
	}
}

// An integer too large for its field is cut to the field's width, as the
// package doc warns: the library gives no error, and the codec adds none.
func TestNarrowIntegersAreCutAsDocumented(t *testing.T) {
	c, err := msgpack.New(msgpack.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	type wide struct{ N, M int64 }
	type narrow struct {
		N int8
		M uint32
	}
	b, err := c.Marshal(nil, &wide{N: 300, M: -1})
	if err != nil {
		t.Fatal(err)
	}
	var got narrow
	if err := c.Unmarshal(b, &got); err != nil || got.N != 44 || got.M != 4294967295 {
		t.Fatalf("300 into an int8 and -1 into a uint32 gave %+v, %v; the package doc says 44 and 4294967295, no error", got, err)
	}
}
