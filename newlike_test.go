package kernrpc

import (
	"testing"

	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A hedge's second attempt decodes into newLike(reply): for a message
// made from descriptors that must be a message of the same descriptor.
func TestNewLikeKeepsADynamicMessagesType(t *testing.T) {
	md := wrapperspb.String("").ProtoReflect().Descriptor()
	// A descriptor outside the generated types, as a gateway has.
	fd, err := protodesc.NewFile(protodesc.ToFileDescriptorProto(md.ParentFile()), nil)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicpb.NewMessage(fd.Messages().ByName(md.Name()))
	got, ok := newLike(dyn).(*dynamicpb.Message)
	if !ok || got == dyn || got.Descriptor().FullName() != md.FullName() {
		t.Fatalf("newLike(dynamic %s) = %T %v; want a new dynamic message of that type", md.FullName(), newLike(dyn), got)
	}
	if plain, ok := newLike(&descriptorpb.FileDescriptorProto{}).(*descriptorpb.FileDescriptorProto); !ok || plain == nil {
		t.Fatalf("newLike(generated message) = %T", newLike(&descriptorpb.FileDescriptorProto{}))
	}
	n := 3
	if p, ok := newLike(&n).(*int); !ok || p == &n || *p != 0 {
		t.Fatal("newLike(*int) is not a new zero int")
	}
}
