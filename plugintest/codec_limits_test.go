package plugintest

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// codecScratch is the fixed buffer the codecs below were written around:
// each works for every message smaller than it, which is every message of
// a quick test, and fails on one larger.
const codecScratch = 16 << 10

// Codecs with a limit of their own are caught, each with the complaint
// for what failed: past a length, Lengths (an error or a panic, in
// Marshal or in Unmarshal) and Size (a panic); one call at a time,
// Concurrent.
func TestCodecCatchesLimitsOfItsOwn(t *testing.T) {
	var pb protobuf.Codec
	large := func(v any) bool {
		m, ok := v.(*echopb.Echo)
		return ok && m != nil && len(m.Payload)+len(m.Text) > codecScratch
	}
	cases := []struct {
		name  string
		codec *codecFault
		path  string
		msg   string
	}{
		{"marshal refuses what outgrows its buffer", &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
			if large(v) {
				return nil, errors.New("message larger than the 16 KiB encode buffer")
			}
			return pb.Marshal(dst, v)
		}}, "Codec/Lengths", "the codec must encode values of every length"},
		{"marshal overruns its buffer", &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
			if m, ok := v.(*echopb.Echo); ok && m != nil {
				var scratch [codecScratch]byte
				n := copy(scratch[:], m.Payload)
				scratch[n] = 0 // a terminator, past the end once the payload fills it
			}
			return pb.Marshal(dst, v)
		}}, "Codec/Lengths", "bytes panicked: runtime error: index out of range"},
		{"unmarshal refuses what outgrows its buffer", &codecFault{unmarshal: func(data []byte, v any) error {
			if len(data) > codecScratch {
				return errors.New("input larger than the 16 KiB decode buffer")
			}
			return pb.Unmarshal(data, v)
		}}, "Codec/Lengths", "the codec must decode its own encoding at every length"},
		{"unmarshal overruns its buffer", &codecFault{unmarshal: func(data []byte, v any) error {
			var scratch [codecScratch]byte
			n := copy(scratch[:], data)
			scratch[n] = 0
			return pb.Unmarshal(data, v)
		}}, "Codec/Lengths", "...) panicked: runtime error: index out of range"},
		{"size looks widths up in a table of 16 KiB", &codecFault{size: func(v any) int {
			// Length-prefix widths by KiB of payload, up to the buffer.
			var widths [codecScratch>>10 + 1]int
			if m, ok := v.(*echopb.Echo); ok && m != nil {
				_ = widths[len(m.Payload)>>10]
			}
			return pb.Size(v)
		}}, "Codec/Size", "Size panicked: runtime error: index out of range"},
		// A codec guarding one encoder or decoder with a busy flag rather
		// than giving each call its own.
		{"marshal refuses while another runs", &codecFault{marshal: func() func([]byte, any) ([]byte, error) {
			var b codecBusy
			return func(dst []byte, v any) ([]byte, error) {
				if !b.enter() {
					return nil, errors.New("encoder busy")
				}
				defer b.leave()
				return pb.Marshal(dst, v)
			}
		}()}, "Codec/Concurrent", "): encoder busy"},
		{"unmarshal refuses while another runs", &codecFault{unmarshal: func() func([]byte, any) error {
			var b codecBusy
			return func(data []byte, v any) error {
				if !b.enter() {
					return errors.New("decoder busy")
				}
				defer b.leave()
				return pb.Unmarshal(data, v)
			}
		}()}, "Codec/Concurrent", "): decoder busy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1}
			rec := codecRecord(t, codecFaultFactory(func() kernel.Codec { return tc.codec }), cfg)
			expectCaught(t, rec, tc.path)
			expectMessage(t, rec, tc.path, tc.msg)
		})
	}
}

// codecBusy is a flag guarding one encoder or decoder. Its holder yields,
// as a loaded machine's scheduler would let another call in, so that a
// second call finds it held on any number of CPUs.
type codecBusy struct{ held atomic.Bool }

func (b *codecBusy) enter() bool {
	if !b.held.CompareAndSwap(false, true) {
		return false
	}
	runtime.Gosched()
	return true
}

func (b *codecBusy) leave() { b.held.Store(false) }
