package protobuf_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/sizeonlypb"
)

// A message generated with vtprotobuf's size feature but not its marshal
// feature (SizeVT, no MarshalToSizedBufferVT) must go through the engine's
// sized path (Size, then MarshalSized with its result) after it was
// changed since an earlier, finished encoding: a request reused across
// calls.
func TestMarshalSizedSizeVTOnlyMessageChangedSinceLastSend(t *testing.T) {
	var c protobuf.Codec
	m := &sizeonlypb.Outer{Inner: &sizeonlypb.Inner{Data: []byte("ab")}}
	if _, err := c.Marshal(nil, m); err != nil { // the first send
		t.Fatal(err)
	}
	m.Inner.Data = []byte("abcdef") // then the caller changes it, and sends again
	size := c.Size(m)
	out, err := c.MarshalSized(nil, m, size)
	if err != nil {
		t.Fatalf("MarshalSized(Size()=%d): %v", size, err)
	}
	want, _ := proto.Marshal(m)
	if string(out) != string(want) {
		t.Fatalf("MarshalSized wrote %x, want %x", out, want)
	}
}
