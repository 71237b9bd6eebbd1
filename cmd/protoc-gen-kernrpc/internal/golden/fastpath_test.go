package golden_test

import (
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/internal/golden/commonv1"
	"github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/internal/golden/gentestv1"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// The methods the protobuf codec looks for (see plugins/codec/protobuf),
// by the same shapes.
type (
	vtMarshaler interface {
		SizeVT() int
		MarshalToSizedBufferVT([]byte) (int, error)
	}
	vtUnmarshaler interface{ UnmarshalVT([]byte) error }
	vtInPlace     interface{ UnmarshalVTUnsafe([]byte) error }
)

// Every message of the generated files, nested ones included, has the
// methods of the codec's fast path.
func TestEveryGeneratedMessageHasTheFastPathMethods(t *testing.T) {
	files := []protoreflect.FileDescriptor{
		commonv1.File_kernrpc_gentest_common_v1_common_proto,
		gentestv1.File_kernrpc_gentest_v1_greeter_proto,
		gentestv1.File_kernrpc_gentest_v1_admin_proto,
	}
	n := 0
	var visit func(protoreflect.MessageDescriptors)
	visit = func(msgs protoreflect.MessageDescriptors) {
		for i := range msgs.Len() {
			md := msgs.Get(i)
			visit(md.Messages())
			if md.IsMapEntry() { // no Go type of its own
				continue
			}
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Errorf("%s: %v", md.FullName(), err)
				continue
			}
			m := mt.New().Interface()
			_, marshals := m.(vtMarshaler)
			_, unmarshals := m.(vtUnmarshaler)
			_, inPlace := m.(vtInPlace)
			if !marshals || !unmarshals || !inPlace {
				t.Errorf("%T: SizeVT+MarshalToSizedBufferVT %v, UnmarshalVT %v, UnmarshalVTUnsafe %v; want all", m, marshals, unmarshals, inPlace)
			}
			n++
		}
	}
	for _, f := range files {
		visit(f.Messages())
	}
	if n < 10 {
		t.Fatalf("checked %d messages; the test set has more", n)
	}
}

// The codec takes the fast path for generated messages, as its one
// difference from protobuf-go shows: vtprotobuf's methods do not check
// that strings are UTF-8, protobuf-go's reflection does. A message
// without the methods (wrapperspb) is the control: the codec refuses it.
func TestTheCodecTakesTheFastPath(t *testing.T) {
	codec, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	const notUTF8 = "caf\xe9"

	if _, err := codec.Marshal(nil, wrapperspb.String(notUTF8)); err == nil {
		t.Fatal("the codec encoded a wrapperspb.StringValue that is not UTF-8: the control shows nothing")
	}
	msg := &gentestv1.ChatMessage{Text: notUTF8, Payload: []byte("p")}
	if _, err := proto.Marshal(msg); err == nil {
		t.Fatal("proto.Marshal encoded a string that is not UTF-8")
	}
	data, err := codec.Marshal(nil, msg)
	if err != nil {
		t.Fatalf("the codec refused a generated message it should encode with MarshalToSizedBufferVT: %v", err)
	}
	if err := proto.Unmarshal(data, new(gentestv1.ChatMessage)); err == nil {
		t.Fatal("proto.Unmarshal decoded a string that is not UTF-8")
	}
	var got gentestv1.ChatMessage
	if err := codec.Unmarshal(data, &got); err != nil {
		t.Fatalf("the codec refused bytes it should decode with UnmarshalVT: %v", err)
	}
	if got.Text != notUTF8 || string(got.Payload) != "p" {
		t.Errorf("decoded %q, %q", got.Text, got.Payload)
	}
}

// With alias_requests the codec decodes a generated message in place
// (UnmarshalVTUnsafe): its bytes point into the frame. By default they
// are copied.
func TestAliasRequestsDecodesGeneratedMessagesInPlace(t *testing.T) {
	data, err := proto.Marshal(&gentestv1.ChatMessage{Text: "t", Payload: make([]byte, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	inside := func(b []byte) bool {
		p, start := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(data)))
		return p >= start && p < start+uintptr(len(data))
	}
	aliasing, err := protobuf.New(&protobuf.Options{AliasRequests: true})
	if err != nil {
		t.Fatal(err)
	}
	var m gentestv1.ChatMessage
	if err := aliasing.(kernel.InPlaceUnmarshaler).UnmarshalInPlace(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Payload) != 1024 || !inside(m.Payload) {
		t.Errorf("alias_requests: the payload (%d bytes) does not point into the frame", len(m.Payload))
	}
	copying, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var c gentestv1.ChatMessage
	if err := copying.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Payload) != 1024 || inside(c.Payload) {
		t.Errorf("default options: the payload (%d bytes) points into the frame", len(c.Payload))
	}
}

// What the fast path encodes, protobuf-go decodes to the same message, and
// the other way round: every kind of field of the test set (maps, oneofs,
// optional, nested, repeated, enums, well-known and imported types).
func TestTheFastPathAgreesWithProtobufGo(t *testing.T) {
	codec, err := protobuf.New(protobuf.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []proto.Message{
		&gentestv1.HelloReply{Message: "m", At: timestamppb.Now(), Counts: map[string]int32{"a": 1, "b": -2}, Extra: &gentestv1.HelloReply_Code{Code: -7}, Maybe: proto.Int32(0)},
		&gentestv1.HelloReply{Extra: &gentestv1.HelloReply_Note{Note: "n"}},
		&gentestv1.HelloRequest{Name: "x", Options: &gentestv1.HelloRequest_Options{Shout: true, Titles: []string{"a", "", "c"}}},
		&gentestv1.Event{Seq: 1 << 40, Mood: gentestv1.Mood_MOOD_HAPPY, Options: &gentestv1.HelloRequest_Options{}},
		&commonv1.Chunk{Data: []byte{0, 1, 2}, SentAt: timestamppb.Now(), Labels: []string{"l"}},
	}
	for _, m := range msgs {
		fast, err := codec.Marshal(nil, m)
		if err != nil {
			t.Fatalf("%T: codec: %v", m, err)
		}
		back := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(fast, back); err != nil || !proto.Equal(back, m) {
			t.Errorf("%T: protobuf-go decoded the fast path's bytes to %v (%v), want %v", m, back, err, m)
		}
		slow, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		back = m.ProtoReflect().New().Interface()
		if err := codec.Unmarshal(slow, back); err != nil || !proto.Equal(back, m) {
			t.Errorf("%T: the fast path decoded protobuf-go's bytes to %v (%v), want %v", m, back, err, m)
		}
	}
}
