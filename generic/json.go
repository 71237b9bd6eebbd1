package generic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// UnmarshalJSON builds a message of type desc from its protojson form
// (field names as in the .proto or in lowerCamelCase, enums by name, 64-bit
// integers as numbers or strings). Empty input is the empty message. An
// error wraps ErrBadJSON and names the field that does not fit: an unknown
// one, or one whose value has the wrong type.
func UnmarshalJSON(desc protoreflect.MessageDescriptor, data []byte) (*dynamicpb.Message, error) {
	m := dynamicpb.NewMessage(desc)
	if len(bytes.TrimSpace(data)) == 0 {
		return m, nil
	}
	if err := protojson.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%w for %s: %s", ErrBadJSON, desc.FullName(), withoutProtoPrefix(err))
	}
	return m, nil
}

// withoutProtoPrefix is err's text without the "proto: " protobuf-go
// puts before it (spelt with a no-break space in some builds, so that no
// one matches on it): the message names the field and the position.
func withoutProtoPrefix(err error) string {
	s := err.Error()
	for _, p := range []string{"proto: ", "proto:\u00a0"} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// MarshalJSON is m in its protojson form, compact, with the field names of
// the .proto; fields at their zero value are left out, as protojson does.
func MarshalJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("generic: %s as JSON: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	// protojson varies its spacing from build to build on purpose; the
	// compact form is the same everywhere.
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, fmt.Errorf("generic: %s as JSON: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return out.Bytes(), nil
}
