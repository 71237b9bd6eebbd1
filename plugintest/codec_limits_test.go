package plugintest

import (
	"errors"
	"testing"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// codecScratch is the fixed buffer the codecs below were written around:
// each works for every message smaller than it, which is every message of
// a quick test, and fails on one larger.
const codecScratch = 16 << 10

// Codecs that fail past a length of their own are caught by Lengths, with
// the complaint for the step that failed: an error or a panic, in Marshal
// or in Unmarshal.
func TestCodecCatchesLengthLimits(t *testing.T) {
	var pb protobuf.Codec
	large := func(v any) bool {
		m, ok := v.(*echopb.Echo)
		return ok && m != nil && len(m.Payload)+len(m.Text) > codecScratch
	}
	cases := []struct {
		name  string
		codec *codecFault
		msg   string
	}{
		{"marshal refuses what outgrows its buffer", &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
			if large(v) {
				return nil, errors.New("message larger than the 16 KiB encode buffer")
			}
			return pb.Marshal(dst, v)
		}}, "the codec must encode values of every length"},
		{"marshal overruns its buffer", &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
			if m, ok := v.(*echopb.Echo); ok && m != nil {
				var scratch [codecScratch]byte
				n := copy(scratch[:], m.Payload)
				scratch[n] = 0 // a terminator, past the end once the payload fills it
			}
			return pb.Marshal(dst, v)
		}}, "bytes panicked: runtime error: index out of range"},
		{"unmarshal refuses what outgrows its buffer", &codecFault{unmarshal: func(data []byte, v any) error {
			if len(data) > codecScratch {
				return errors.New("input larger than the 16 KiB decode buffer")
			}
			return pb.Unmarshal(data, v)
		}}, "the codec must decode its own encoding at every length"},
		{"unmarshal overruns its buffer", &codecFault{unmarshal: func(data []byte, v any) error {
			var scratch [codecScratch]byte
			n := copy(scratch[:], data)
			scratch[n] = 0
			return pb.Unmarshal(data, v)
		}}, "...) panicked: runtime error: index out of range"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1}
			rec := codecRecord(t, codecFaultFactory(func() kernel.Codec { return tc.codec }), cfg)
			expectCaught(t, rec, "Codec/Lengths")
			expectMessage(t, rec, "Codec/Lengths", tc.msg)
		})
	}
}
