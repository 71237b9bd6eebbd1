package protobuf

import "google.golang.org/protobuf/proto"

// ResetsPlainly reports whether New's codec resets m's type with
// proto.Reset rather than ResetVT.
func ResetsPlainly(m proto.Message) bool {
	md := m.ProtoReflect().Descriptor()
	return resetPlainly(factsOf(md), md)
}
