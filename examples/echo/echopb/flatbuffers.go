package echopb

import (
	"fmt"

	fb "github.com/google/flatbuffers/go"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// Echo is generated from echo.proto, which gives it protobuf and json
// (through protoc-gen-go) and msgpack (through its exported fields). These
// three methods, written by hand, give it FlatBuffers too, as the table of
// internal/echofb/echo.fbs, so that the example's one handler serves every
// built-in codec.

// MarshalFlatBuffer writes x into b as an echofb.Echo table and returns the
// table's offset.
func (x *Echo) MarshalFlatBuffer(b *fb.Builder) fb.UOffsetT {
	var payload, text fb.UOffsetT // children first: a table refers back to them
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

// FlatBufferSize bounds x's encoding, so that the codec can ask for a
// buffer it fits in: the fields plus 64 bytes of offsets, vtable and
// padding.
func (x *Echo) FlatBufferSize() int { return len(x.GetPayload()) + len(x.GetText()) + 64 }

// UnmarshalFlatBuffer sets x from buf, an encoded echofb.Echo, once
// checked. Payload points into buf (see the flatbuffers codec for how long
// that stays valid); Text is copied.
func (x *Echo) UnmarshalFlatBuffer(buf []byte) error {
	if x == nil {
		return fmt.Errorf("echopb: cannot unmarshal a flatbuffer into a nil *Echo; pass new(echopb.Echo)")
	}
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
