package json_test

import (
	"bytes"
	encjson "encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/json"
)

// order is a plain Go value with the kinds of field encoding/json treats
// specially: a renamed field, an omitted one, bytes, a nested struct, a map
// and unicode text.
type order struct {
	ID       int64             `json:"id"`
	Customer string            `json:"customer"`
	Lines    []line            `json:"lines"`
	Labels   map[string]string `json:"labels,omitempty"`
	Blob     []byte            `json:"blob,omitempty"`
	internal string
}

type line struct {
	SKU   string  `json:"sku"`
	Count int     `json:"count"`
	Price float64 `json:"price"`
}

func newCodec(t testing.TB, options map[string]any) kernel.Codec {
	t.Helper()
	c, err := json.Factory.Build(options, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRegisteredUnderName(t *testing.T) {
	c, err := kernel.NewCodec(json.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewCodec(%q): %v", json.Name, err)
	}
	if c.Name() != "json" {
		t.Errorf("Name() = %q, want json", c.Name())
	}
	if _, err := kernel.NewCodec(json.Name, map[string]any{"discard_unknwon": true}, "kernrpc.yaml"); err == nil || !strings.Contains(err.Error(), "discard_unknwon") {
		t.Errorf("a misspelt option: err = %v, want one naming it", err)
	}
}

// Protobuf messages take protojson's JSON names: lowerCamelCase.
func TestProtobufFieldNamesAreProtojsons(t *testing.T) {
	c := newCodec(t, nil)
	msg := &descriptorpb.FieldDescriptorProto{Name: proto.String("id"), JsonName: proto.String("id"), TypeName: proto.String(".pkg.T")}
	b, err := c.Marshal(nil, msg)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := encjson.Unmarshal(b, &fields); err != nil {
		t.Fatalf("output %s is not JSON: %v", b, err)
	}
	for _, want := range []string{"name", "jsonName", "typeName"} {
		if _, ok := fields[want]; !ok {
			t.Errorf("output %s lacks field %q", b, want)
		}
	}
	if _, ok := fields["type_name"]; ok {
		t.Errorf("output %s uses the proto field name type_name; want protojson's default typeName", b)
	}

	b, err = c.Marshal(nil, &echopb.Echo{Text: "hi", Payload: []byte{0xff, 0}})
	if err != nil {
		t.Fatal(err)
	}
	var echo map[string]string
	if err := encjson.Unmarshal(b, &echo); err != nil || echo["text"] != "hi" || echo["payload"] != "/wA=" {
		t.Errorf("echo encoded as %s (%v); want text \"hi\" and payload in base64 \"/wA=\"", b, err)
	}
}

func TestPlainValuesUseJSONTags(t *testing.T) {
	c := newCodec(t, nil)
	b, err := c.Marshal(nil, order{ID: 7, Customer: "Zoë <&>", internal: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":7,"customer":"Zoë <&>","lines":null}`
	if string(b) != want {
		t.Errorf("Marshal = %s, want %s (tags honoured, no HTML escaping, no trailing newline)", b, want)
	}
}

func TestUnknownFields(t *testing.T) {
	cases := []struct {
		name  string
		input string
		into  func() any
	}{
		{"protobuf message", `{"text":"hi","colour":"red"}`, func() any { return new(echopb.Echo) }},
		{"plain struct", `{"id":1,"colour":"red"}`, func() any { return new(order) }},
		{"nested plain struct", `{"id":1,"lines":[{"sku":"a","colour":"red"}]}`, func() any { return new(order) }},
	}
	strict, lenient := newCodec(t, nil), newCodec(t, map[string]any{"discard_unknown": true})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := strict.Unmarshal([]byte(tc.input), tc.into())
			if err == nil || !strings.Contains(err.Error(), "colour") || !strings.Contains(err.Error(), "discard_unknown") {
				t.Errorf("by default: err = %v, want an error naming the field and the option that accepts it", err)
			}
			if err := lenient.Unmarshal([]byte(tc.input), tc.into()); err != nil {
				t.Errorf("with discard_unknown: %v, want the field ignored", err)
			}
		})
	}
}

func TestOneValueOnly(t *testing.T) {
	for _, opts := range []map[string]any{nil, {"discard_unknown": true}} {
		c := newCodec(t, opts)
		for _, in := range []string{`{"id":1} {"id":2}`, `{"id":1}x`} {
			if err := c.Unmarshal([]byte(in), new(order)); err == nil {
				t.Errorf("options %v: Unmarshal(%s) succeeded; want an error for the data after the value", opts, in)
			}
		}
		if err := c.Unmarshal([]byte(" {\"id\":1}\n\t"), new(order)); err != nil {
			t.Errorf("options %v: whitespace around the value: %v", opts, err)
		}
		if err := c.Unmarshal(nil, new(order)); err == nil {
			t.Errorf("options %v: empty input decoded; want an error", opts)
		}
	}
	c := newCodec(t, nil)
	if err := c.Unmarshal([]byte(`{"id":1} {}`), new(order)); !errors.Is(err, json.ErrTrailingData) {
		t.Errorf("err = %v, want it to wrap ErrTrailingData", err)
	}
}

// A reused value keeps nothing from before, as with the protobuf codec.
func TestUnmarshalReplacesTheValue(t *testing.T) {
	c := newCodec(t, nil)
	o := &order{ID: 1, Customer: "old", Labels: map[string]string{"stale": "yes"}}
	if err := c.Unmarshal([]byte(`{"id":2,"labels":{"new":"yes"}}`), o); err != nil {
		t.Fatal(err)
	}
	if o.Customer != "" || len(o.Labels) != 1 || o.Labels["new"] != "yes" {
		t.Errorf("decoded into a used value: %+v; want only what the input holds", o)
	}
	e := &echopb.Echo{Text: "old", Payload: []byte("old")}
	if err := c.Unmarshal([]byte(`{"text":"new"}`), e); err != nil {
		t.Fatal(err)
	}
	if e.Text != "new" || e.Payload != nil {
		t.Errorf("decoded into a used message: %v; want only the new text", e)
	}
}

func TestMarshalAppends(t *testing.T) {
	c := newCodec(t, nil)
	for _, v := range []any{order{ID: 1}, &echopb.Echo{Text: "x"}} {
		dst := append(make([]byte, 0, 256), "hdr"...)
		out, err := c.Marshal(dst, v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(out, []byte("hdr{")) || &out[0] != &dst[0] {
			t.Errorf("Marshal(%T) = %q; want the JSON appended in place after \"hdr\"", v, out)
		}
	}
	if _, err := c.Marshal(nil, make(chan int)); err == nil || !strings.Contains(err.Error(), "chan int") {
		t.Errorf("Marshal(chan) = %v, want an error naming the type", err)
	}
}

// Nesting deeper than the decoders allow is an error, not a stack overflow.
func TestDeepNestingIsAnError(t *testing.T) {
	deep := []byte(strings.Repeat("[", 100001) + strings.Repeat("]", 100001))
	for _, opts := range []map[string]any{nil, {"discard_unknown": true}} {
		c := newCodec(t, opts)
		var v any
		if err := c.Unmarshal(deep, &v); err == nil {
			t.Errorf("options %v: 100001 nested arrays decoded; want an error", opts)
		}
		in := append([]byte(`{"text":"a","x":`), deep...)
		if err := c.Unmarshal(append(in, '}'), new(echopb.Echo)); err == nil {
			t.Errorf("options %v: a deeply nested unknown field decoded into a message; want an error", opts)
		}
	}
}

// FuzzUnmarshal feeds both paths, protojson and encoding/json: no input may
// panic, and what one accepts must survive a round trip.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{`{}`, `{"text":"hi","payload":"AAEC"}`, `{"id":1,"customer":"a","lines":[{"sku":"x","count":2,"price":1.5}],"labels":{"k":"v"},"blob":"AA=="}`, `null`, `[1,2]`, `{"text":"\u00e9\ud83d\ude00"}`} {
		f.Add([]byte(s))
	}
	c := newCodec(f, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		var m echopb.Echo
		if c.Unmarshal(data, &m) == nil {
			b, err := c.Marshal(nil, &m)
			if err != nil {
				t.Fatalf("re-Marshal of accepted message %v: %v", &m, err)
			}
			var again echopb.Echo
			if err := c.Unmarshal(b, &again); err != nil || !proto.Equal(&m, &again) {
				t.Fatalf("protojson round trip: %v then %v (%v)", &m, &again, err)
			}
		}
		var o order
		if c.Unmarshal(data, &o) == nil {
			b, err := c.Marshal(nil, o)
			if err != nil {
				t.Fatalf("re-Marshal of accepted value %+v: %v", o, err)
			}
			var again order
			if err := c.Unmarshal(b, &again); err != nil {
				t.Fatalf("Unmarshal of our own encoding %s: %v", b, err)
			}
			b2, _ := c.Marshal(nil, again)
			if !bytes.Equal(b, b2) {
				t.Fatalf("encoding/json round trip changed the value: %s then %s", b, b2)
			}
		}
	})
}
