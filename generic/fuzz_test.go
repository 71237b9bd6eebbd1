package generic_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
)

// FuzzParseDescriptorSet reads any bytes as a descriptor set, as
// `kernrpc call -protoset FILE` does with a file a person names. It is
// refused with ErrBadDescriptorSet, or every method it lists is found by
// name, and an empty request of each method, filled from "{}", survives
// protobuf's wire form and JSON.
func FuzzParseDescriptorSet(f *testing.F) {
	for _, path := range []string{notesSet, gatewaySet} {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, err := generic.ParseDescriptorSet(b)
		if err != nil {
			if !errors.Is(err, generic.ErrBadDescriptorSet) {
				t.Fatalf("refusal %v does not wrap ErrBadDescriptorSet", err)
			}
			return
		}
		services, err := src.Services(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, svc := range services {
			for _, m := range svc.Methods {
				md, err := generic.FindMethod(context.Background(), src, m.Name)
				if err != nil {
					t.Fatalf("method %s, listed, not found: %v", m.Name, err)
				}
				roundTrip(t, md.Input(), []byte("{}"))
			}
		}
	})
}

// FuzzUnmarshalJSON reads any JSON as a request of a message type with
// a string, an int32, an enum, a repeated field and a nested message
// holding a well-known type (Timestamp), as `kernrpc call ADDR METHOD
// JSON` does. It is refused with ErrBadJSON, or the message survives protobuf's
// wire form and JSON.
func FuzzUnmarshalJSON(f *testing.F) {
	desc := (&testpb.Note{}).ProtoReflect().Descriptor()
	for _, seed := range []string{
		`{}`, ``, `{"text":"a","count":-2,"tags":["x"],"meta":{"author":"b","at":"2026-12-05T17:00:00.5Z"}}`,
		`{"color":"COLOR_RED"}`, `{"color":7}`, `{"count":"12"}`, `{"text":1}`, `{"nope":1}`,
		`{"text":"a"} {"text":"b"}`, `[]`, `null`, `{"text":"\ud800"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, desc, data)
	})
}

// roundTrip decodes data as JSON of desc and checks what it accepted
// survives protobuf's wire form and generic's own JSON.
func roundTrip(t *testing.T, desc protoreflect.MessageDescriptor, data []byte) {
	t.Helper()
	m, err := generic.UnmarshalJSON(desc, data)
	if err != nil {
		if !errors.Is(err, generic.ErrBadJSON) {
			t.Fatalf("refusal %v of %q does not wrap ErrBadJSON", err, data)
		}
		return
	}
	wire, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("%s from %q does not marshal: %v", desc.FullName(), data, err)
	}
	back, err := generic.UnmarshalJSON(desc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(wire, back); err != nil || !proto.Equal(m, back) {
		t.Fatalf("%s from %q: wire form read back as %v (%v)", desc.FullName(), data, back, err)
	}
	j, err := generic.MarshalJSON(m)
	if err != nil {
		t.Fatalf("%s from %q has no JSON form: %v", desc.FullName(), data, err)
	}
	again, err := generic.UnmarshalJSON(desc, j)
	if err != nil || !proto.Equal(m, again) {
		t.Fatalf("%s from %q: JSON %s read back as %v (%v)", desc.FullName(), data, j, again, err)
	}
}
