package generic_test

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/anypb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
)

// boxes is anytest.v1.Boxes, a service no Go code is generated for whose
// request packs an anytest.v1.Inner, also without generated code, in a
// google.protobuf.Any.
func boxes(t *testing.T) protoreflect.ServiceDescriptor {
	t.Helper()
	msg := func(name string, fields ...*descriptorpb.FieldDescriptorProto) *descriptorpb.DescriptorProto {
		return &descriptorpb.DescriptorProto{Name: proto.String(name), Field: fields}
	}
	field := func(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), JsonName: proto.String(name), Number: proto.Int32(n),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: typ.Enum()}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		return f
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("anytest.proto"), Package: proto.String("anytest.v1"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/any.proto"},
		MessageType: []*descriptorpb.DescriptorProto{
			msg("Box", field("item", 1, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE, ".google.protobuf.Any")),
			msg("Inner", field("s", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING, ""), field("n", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64, "")),
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Boxes"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Echo"), InputType: proto.String(".anytest.v1.Box"), OutputType: proto.String(".anytest.v1.Box")},
		}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Services().Get(0)
}

// A google.protobuf.Any packing a type the client knows only from the
// server's reflection goes to the server and back in its JSON form: the
// packed type is found where the method's was.
func TestCallJSONWithAnyOfAReflectedType(t *testing.T) {
	sd := boxes(t)
	echo := sd.Methods().ByName("Echo")
	var regErr error
	g := reflectingClient(t, "protobuf", func(s *kernrpc.Server) {
		regErr = generic.Register(s, echo, func(_ context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) { return req, nil })
	})
	if regErr != nil {
		t.Fatal(regErr)
	}
	const box = `{"item":{"@type":"type.googleapis.com/anytest.v1.Inner","s":"x","n":"5"}}`
	got, err := g.CallJSON(context.Background(), "anytest.v1.Boxes.Echo", []byte(box))
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, got, box)
}
