package protobuf_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/presencepb"
)

// A reply decoded into a message reused from an earlier call must read as
// if decoded into a new one. vtprotobuf's ResetVT keeps a bytes field's
// memory as an empty, non-nil slice, which for a field with presence
// (proto3 optional) reads as set: the field would stay present after a
// message that did not carry it. Pooled sub-messages come back from
// vtprotobuf's pool the same way.
func TestUnmarshalIntoAReusedMessageKeepsNoPresence(t *testing.T) {
	inner := func(b string) *presencepb.Inner { return &presencepb.Inner{Data: []byte(b)} }
	first := &presencepb.Outer{
		Data:  []byte("first"),
		Inner: inner("inner"),
		Items: []*presencepb.Inner{inner("a"), inner("b")},
	}
	for name, second := range map[string]*presencepb.Outer{
		"empty":             {},
		"sub-message":       {Inner: &presencepb.Inner{}},
		"repeated":          {Items: []*presencepb.Inner{{}, {Next: &presencepb.Inner{}}}},
		"present, empty":    {Data: []byte{}, Inner: inner("")},
		"present, again":    {Data: []byte("second"), Inner: inner("x")},
		"oneof sub-message": {Choice: &presencepb.Outer_Picked{Picked: &presencepb.Inner{}}},
	} {
		t.Run(name, func(t *testing.T) {
			for _, c := range codecs(t) {
				reused := new(presencepb.Outer)
				decode(t, c, first, reused)
				for range 2 { // the second round takes sub-messages from the pool
					decode(t, c, second, reused)
					if !proto.Equal(reused, second) {
						t.Fatalf("%s: decoding %v into a reused message gave %v", c.name, second, reused)
					}
				}
			}
		})
	}
}

// Which types are reset plainly: only a bytes field whose presence ResetVT
// keeps makes one, so a bytes field of a real oneof (ResetVT clears the
// oneof) does not.
func TestOnlyBytesPresenceResetVTKeepsResetsPlainly(t *testing.T) {
	for _, tc := range []struct {
		m    proto.Message
		want bool
	}{
		{&presencepb.Inner{}, true},      // optional bytes data
		{&presencepb.Outer{}, true},      // optional bytes data, and Inner's
		{&presencepb.OneofOnly{}, false}, // bytes only in a real oneof
		{&echopb.Echo{}, false},          // plain bytes
	} {
		if got := protobuf.ResetsPlainly(tc.m); got != tc.want {
			t.Errorf("%T: reset plainly = %v, want %v", tc.m, got, tc.want)
		}
	}
}
