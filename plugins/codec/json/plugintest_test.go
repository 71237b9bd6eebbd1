package json_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/codec/json"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	protoEqual := func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }
	newEcho := func() any { return new(echopb.Echo) }
	samples := []plugintest.CodecSample{
		{Name: "small", Value: &echopb.Echo{Text: "hello, kernrpc", Payload: []byte("0123456789abcdef")}, New: newEcho, Equal: protoEqual},
		{Name: "64KiB", Value: &echopb.Echo{Text: "big", Payload: bytes.Repeat([]byte{0, 1, 0xfe, 0xff}, 16<<10)}, New: newEcho, Equal: protoEqual},
		{Name: "unicode", Value: &echopb.Echo{Text: "Zoë ✓ 😀 <&> \"quoted\" \\ \n\t\u0000"}, New: newEcho, Equal: protoEqual},
		{Name: "plain-struct", Value: order{
			ID: -42, Customer: "Zoë", Labels: map[string]string{"a": "1", "ß": "2"}, Blob: []byte{0, 0xff},
			Lines: []line{{SKU: "x", Count: 2, Price: 1.25}, {SKU: "y", Count: 0, Price: -3e-9}},
		}, New: func() any { return new(order) }},
	}
	t.Run("Defaults", func(t *testing.T) {
		plugintest.Codec(t, json.Factory, plugintest.CodecConfig{Samples: samples})
	})
	t.Run("DiscardUnknown", func(t *testing.T) {
		plugintest.Codec(t, json.Factory, plugintest.CodecConfig{Options: map[string]any{"discard_unknown": true}, Samples: samples})
	})
}
