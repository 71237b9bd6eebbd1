package msgpack_test

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/codec/msgpack"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	protoEqual := func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }
	newEcho := func() any { return new(echopb.Echo) }
	samples := []plugintest.CodecSample{
		{Name: "small", Value: &echopb.Echo{Text: "hello, kernrpc", Payload: []byte("0123456789abcdef")}, New: newEcho, Equal: protoEqual},
		{Name: "64KiB", Value: &echopb.Echo{Text: "big", Payload: bytes.Repeat([]byte{0, 1, 0xfe, 0xff}, 16<<10)}, New: newEcho, Equal: protoEqual},
		{Name: "plain-struct", Value: reading{
			Sensor: "Zoë ✓ 😀", Values: []float64{-1.5, 0, 3e300}, Tags: map[string]string{"a": "1", "ß": "2"},
			Raw: []byte{0, 0xff}, At: time.Date(2026, 12, 2, 13, 0, 0, 123456789, time.UTC),
			Where: location{Lat: 52.5, Lon: 13.4}, Count: -7,
		}, New: func() any { return new(reading) }, Equal: readingEqual},
	}
	t.Run("Defaults", func(t *testing.T) {
		plugintest.Codec(t, msgpack.Factory, plugintest.CodecConfig{Samples: samples})
	})
	t.Run("DiscardUnknown", func(t *testing.T) {
		plugintest.Codec(t, msgpack.Factory, plugintest.CodecConfig{Options: map[string]any{"discard_unknown": true}, Samples: samples})
	})
}

// readingEqual compares readings field by field, At as an instant: the
// library decodes a time in the local zone.
func readingEqual(want, got any) bool {
	w, g := want.(reading), *got.(*reading)
	if !w.At.Equal(g.At) {
		return false
	}
	w.At, g.At = time.Time{}, time.Time{}
	return reflect.DeepEqual(w, g)
}
