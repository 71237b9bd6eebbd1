package protobuf_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/plainpb"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Codec(t, protobuf.Factory, plugintest.CodecConfig{
		Samples: echoSamples(),
		// The wire format: an encoding cut at a field boundary is the
		// message without its later fields, and two encodings in a row
		// are one message, merged.
		Lenient: plugintest.CodecLeniency{Prefixes: true, Concatenation: true},
	})
}

// echoSamples are echo messages covering each field: short text, a 64 KiB
// payload (every byte value, so no encoding shortcut hides a bug), and
// multi-byte unicode text.
func echoSamples() []plugintest.CodecSample {
	payload := make([]byte, 64<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	msgs := []struct {
		name string
		msg  *echopb.Echo
	}{
		{"small", &echopb.Echo{Text: "hello, kernrpc", Payload: []byte{0, 1, 2, 0xff}}},
		{"64KiB", &echopb.Echo{Text: "big", Payload: payload}},
		{"unicode", &echopb.Echo{Text: "héllo, 世界 — ✓ 🚀 " + string(bytes.Repeat([]byte("ü"), 100))}},
	}
	equal := func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }
	samples := make([]plugintest.CodecSample, len(msgs))
	for i, m := range msgs {
		samples[i] = plugintest.CodecSample{
			Name:  m.name,
			Value: m.msg,
			New:   func() any { return new(echopb.Echo) },
			Equal: equal,
		}
	}
	// The default path: a message protoc-gen-go alone generated, which
	// protobuf-go encodes through reflection, and one with messages
	// inside messages, whose lengths MarshalSized takes from the sizes
	// Size cached.
	return append(samples,
		plugintest.CodecSample{Name: "plain", Value: &plainpb.Echo{Text: "plain", Payload: payload[:300]},
			New: func() any { return new(plainpb.Echo) }, Equal: equal},
		plugintest.CodecSample{Name: "nested", Value: protodesc.ToFileDescriptorProto(echopb.File_internal_echopb_echo_proto),
			New: func() any { return new(descriptorpb.FileDescriptorProto) }, Equal: equal})
}
