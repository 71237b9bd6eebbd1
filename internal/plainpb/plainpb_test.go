package plainpb_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/plainpb"
)

// The package exists to be the general path: if vtprotobuf methods ever
// get generated here, the benchmarks' default path would silently become
// the tuned one.
func TestHasNoVTMethods(t *testing.T) {
	var m any = &plainpb.Echo{}
	if _, ok := m.(interface{ UnmarshalVT([]byte) error }); ok {
		t.Error("plainpb.Echo has UnmarshalVT: regenerate with protoc-gen-go only (see gen.go)")
	}
	if _, ok := m.(interface{ MarshalToSizedBufferVT([]byte) (int, error) }); ok {
		t.Error("plainpb.Echo has MarshalToSizedBufferVT: regenerate with protoc-gen-go only (see gen.go)")
	}
}

// Both echo messages register in one binary under names of their own, and
// carry the same fields on the wire.
func TestSameWireAsEchopb(t *testing.T) {
	p, e := (&plainpb.Echo{}).ProtoReflect().Descriptor(), (&echopb.Echo{}).ProtoReflect().Descriptor()
	if p.FullName() == e.FullName() || p.ParentFile().Path() == e.ParentFile().Path() {
		t.Fatalf("plainpb and echopb share a name: %s in %s", p.FullName(), p.ParentFile().Path())
	}
	b, err := proto.Marshal(&plainpb.Echo{Payload: []byte{1, 2, 3}, Text: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	var got echopb.Echo
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if string(got.Payload) != "\x01\x02\x03" || got.Text != "hi" {
		t.Errorf("echopb read %v from plainpb's encoding", &got)
	}
}
