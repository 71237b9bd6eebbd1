package generic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// resolver is what protojson looks up the type a google.protobuf.Any
// names in (and extensions by name).
type resolver interface {
	protoregistry.MessageTypeResolver
	protoregistry.ExtensionTypeResolver
}

// UnmarshalJSON builds a message of type desc from its protojson form
// (field names as in the .proto or in lowerCamelCase, enums by name, 64-bit
// integers as numbers or strings). Empty input is the empty message. An
// error wraps ErrBadJSON and names the field that does not fit: an unknown
// one, or one whose value has the wrong type. The type a
// google.protobuf.Any names is looked up among the types linked into the
// program; Client.DecodeJSON also looks in the client's Source.
func UnmarshalJSON(desc protoreflect.MessageDescriptor, data []byte) (*dynamicpb.Message, error) {
	return unmarshalJSON(protoregistry.GlobalTypes, desc, data)
}

func unmarshalJSON(r resolver, desc protoreflect.MessageDescriptor, data []byte) (*dynamicpb.Message, error) {
	m := dynamicpb.NewMessage(desc)
	if len(bytes.TrimSpace(data)) == 0 {
		return m, nil
	}
	if err := (protojson.UnmarshalOptions{Resolver: r}).Unmarshal(data, m); err != nil {
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
// The type a google.protobuf.Any names is looked up as UnmarshalJSON
// does; Client.EncodeJSON also looks in the client's Source.
func MarshalJSON(m proto.Message) ([]byte, error) {
	return marshalJSON(protoregistry.GlobalTypes, m)
}

func marshalJSON(r resolver, m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, Resolver: r}.Marshal(m)
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

// sourceTypes resolves the types an Any names from a Source, then among
// the types linked into the program: a client that has its descriptors
// from a server's reflection or a descriptor set has no generated code for
// the types packed in an Any, any more than for the method's own.
type sourceTypes struct {
	ctx context.Context
	src Source
}

func (r sourceTypes) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	if d, err := r.src.FindDescriptor(r.ctx, name); err == nil {
		if md, ok := d.(protoreflect.MessageDescriptor); ok {
			return dynamicpb.NewMessageType(md), nil
		}
	}
	return protoregistry.GlobalTypes.FindMessageByName(name)
}

// FindMessageByURL looks up the name after the URL's last slash, as
// protoregistry does: "type.googleapis.com/pkg.Msg" is pkg.Msg.
func (r sourceTypes) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	name := url
	if i := strings.LastIndexByte(url, '/'); i >= 0 {
		name = url[i+1:]
	}
	return r.FindMessageByName(protoreflect.FullName(name))
}

func (r sourceTypes) FindExtensionByName(name protoreflect.FullName) (protoreflect.ExtensionType, error) {
	if d, err := r.src.FindDescriptor(r.ctx, name); err == nil {
		if xd, ok := d.(protoreflect.ExtensionDescriptor); ok && xd.IsExtension() {
			return dynamicpb.NewExtensionType(xd), nil
		}
	}
	return protoregistry.GlobalTypes.FindExtensionByName(name)
}

func (r sourceTypes) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(message, field)
}
