package echopb

import (
	"fmt"

	fb "github.com/google/flatbuffers/go"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// Echo also speaks FlatBuffers, as the table in internal/echofb/echo.fbs, so
// that one echo handler taking *Echo serves every codec: protobuf and json
// through its generated code, msgpack through its exported fields, and
// flatbuffers through the three methods below.

// MarshalFlatBuffer writes x into b as an echofb.Echo table and returns the
// table's offset. A nil x writes an empty table, as protobuf encodes a nil
// message as the empty one.
func (x *Echo) MarshalFlatBuffer(b *fb.Builder) fb.UOffsetT {
	// Children first: a FlatBuffers table refers back to what precedes it.
	var payload, text fb.UOffsetT
	if p := x.GetPayload(); len(p) > 0 {
		payload = b.CreateByteVector(p)
	}
	if t := x.GetText(); t != "" {
		text = b.CreateString(t)
	}
	echofb.EchoStart(b)
	if payload != 0 {
		echofb.EchoAddPayload(b, payload)
	}
	if text != 0 {
		echofb.EchoAddText(b, text)
	}
	return echofb.EchoEnd(b)
}

// flatBufferOverhead bounds what an encoded Echo takes beyond its payload
// and text: root offset, vtable, table, two vector lengths, the string's
// NUL and alignment padding.
const flatBufferOverhead = 64

// FlatBufferSize is an upper bound of x's FlatBuffers encoding, so that the
// kernel can hand the codec a buffer it fits in.
func (x *Echo) FlatBufferSize() int {
	return len(x.GetPayload()) + len(x.GetText()) + flatBufferOverhead
}

// UnmarshalFlatBuffer sets x from buf, an encoded echofb.Echo, after
// checking it. Payload is not copied: it points into buf, and is valid as
// long as buf is (on a server, until the handler has returned and its
// response is encoded; see the flatbuffers codec). Text is copied, since a
// Go string must not change under its reader.
func (x *Echo) UnmarshalFlatBuffer(buf []byte) error {
	if x == nil {
		return fmt.Errorf("echopb: cannot unmarshal a flatbuffer into a nil *Echo; pass new(echopb.Echo)")
	}
	// fbverify.InitRoot, spelt out: through its interfaces t would escape
	// to the heap, one allocation per call.
	pos, err := fbverify.Root(buf)
	if err != nil {
		return fmt.Errorf("echopb: unmarshal %d-byte flatbuffer: %w", len(buf), err)
	}
	var t echofb.Echo
	t.Init(buf, pos)
	if err := t.VerifyFlatBuffer(); err != nil {
		return fmt.Errorf("echopb: unmarshal %d-byte flatbuffer: %w", len(buf), err)
	}
	x.Reset()
	x.Payload = t.PayloadBytes()
	x.Text = string(t.Text())
	return nil
}
