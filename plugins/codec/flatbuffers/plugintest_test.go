package flatbuffers_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	protoEqual := func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }
	newEcho := func() any { return new(echopb.Echo) }
	newTable := func() any { return new(echofb.Echo) }
	table := func(text string, payload []byte) *echofb.Echo {
		return echofb.GetRootAsEcho(buildEcho(text, payload), 0)
	}
	big := bytes.Repeat([]byte{0, 1, 0xfe, 0xff}, 16<<10)
	plugintest.Codec(t, flatbuffers.Factory, plugintest.CodecConfig{
		// The format reads only what the root offset leads to: bytes after
		// it are never looked at, and cutting the padding after the last
		// object leaves a buffer that still verifies.
		Lenient: plugintest.CodecLeniency{Prefixes: true, TrailingBytes: true},
		Samples: []plugintest.CodecSample{
			{Name: "message-small", Value: &echopb.Echo{Text: "hello, kernrpc", Payload: []byte("0123456789abcdef")}, New: newEcho, Equal: protoEqual},
			{Name: "message-64KiB", Value: &echopb.Echo{Text: "big", Payload: big}, New: newEcho, Equal: protoEqual},
			{Name: "message-unicode", Value: &echopb.Echo{Text: "Zoë ✓ 😀 \u0000 end"}, New: newEcho, Equal: protoEqual},
			// A table has no field the suite can set, so it is given its
			// lengths.
			{Name: "table-small", Value: table("hello, kernrpc", []byte("0123456789abcdef")), New: newTable, Equal: tableEqual,
				Sized: func(n int) any { return table("sized", bytes.Repeat([]byte{7}, n)) }},
			{Name: "table-64KiB", Value: table("big", big), New: newTable, Equal: tableEqual},
		}})
}

// tableEqual compares two echofb.Echo by their fields.
func tableEqual(want, got any) bool {
	wt, wp := tableFields(want.(*echofb.Echo))
	gt, gp := tableFields(got.(*echofb.Echo))
	return bytes.Equal(wt, gt) && bytes.Equal(wp, gp)
}

// tableFields reads e's fields; the zero table (no buffer) reads as all
// defaults, as the codec sends it.
func tableFields(e *echofb.Echo) (text, payload []byte) {
	if e.Table().Bytes == nil {
		return nil, nil
	}
	return e.Text(), e.PayloadBytes()
}
