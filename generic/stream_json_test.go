package generic_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/kernel"
)

// A message the client cannot write as JSON (an Any packing a type
// neither its source nor the program knows) fails a server stream with the
// client's own error, as it fails a unary call: not with a status, which
// the command line prints as the server's answer ("code: Internal").
func TestServerStreamJSONUnwritableMessageIsNoStatus(t *testing.T) {
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("anystream.proto"), Package: proto.String("anystream.v1"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/any.proto"},
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Box"), Field: []*descriptorpb.FieldDescriptorProto{{
			Name: proto.String("item"), JsonName: proto.String("item"), Number: proto.Int32(1),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(),
			TypeName: proto.String(".google.protobuf.Any")}}}},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Boxes"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Echo"), InputType: proto.String(".anystream.v1.Box"), OutputType: proto.String(".anystream.v1.Box")},
			{Name: proto.String("Split"), InputType: proto.String(".anystream.v1.Box"), OutputType: proto.String(".anystream.v1.Box"), ServerStreaming: proto.Bool(true)},
		}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	sd := fd.Services().Get(0)
	box := fd.Messages().Get(0)
	unwritable := func() *dynamicpb.Message {
		m := dynamicpb.NewMessage(box)
		item := box.Fields().ByName("item")
		anyMsg := m.Mutable(item).Message()
		anyMsg.Set(anyMsg.Descriptor().Fields().ByName("type_url"), protoreflect.ValueOfString("type.googleapis.com/anystream.v1.Gone"))
		return m
	}
	var regErr error
	g := reflectingClient(t, "protobuf", func(s *kernrpc.Server) {
		regErr = errors.Join(
			generic.Register(s, sd.Methods().ByName("Echo"), func(context.Context, *dynamicpb.Message) (*dynamicpb.Message, error) {
				return unwritable(), nil
			}),
			generic.RegisterStream(s, sd.Methods().ByName("Split"), func(_ context.Context, st *generic.ServerStream) error {
				if _, err := st.Recv(); err != nil {
					return err
				}
				return st.Send(unwritable())
			}))
	})
	if regErr != nil {
		t.Fatal(regErr)
	}
	ctx := context.Background()
	_, unaryErr := g.CallJSON(ctx, "anystream.v1.Boxes.Echo", []byte(`{}`))
	streamErr := g.ServerStreamJSON(ctx, "anystream.v1.Boxes.Split", []byte(`{}`), func([]byte) error { return nil })
	if unaryErr == nil || streamErr == nil {
		t.Fatalf("CallJSON: %v; ServerStreamJSON: %v; want both to fail", unaryErr, streamErr)
	}
	var st *kernel.Status
	if errors.As(unaryErr, &st) {
		t.Errorf("CallJSON: a status %v", unaryErr)
	}
	if errors.As(streamErr, &st) {
		t.Errorf("ServerStreamJSON: %v: a status with code %s, as if the server had answered it; CallJSON says %v", streamErr, st.Code, unaryErr)
	}
}
