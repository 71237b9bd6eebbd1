package plugintest

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// codecEchoSamples are the messages the codec tests certify with: a small
// one with both fields, a 4 KiB payload and unicode text.
func codecEchoSamples() []CodecSample {
	msgs := []struct {
		name string
		msg  *echopb.Echo
	}{
		{"small", &echopb.Echo{Text: "hello", Payload: []byte{0, 1, 2, 0xff}}},
		{"4KiB", &echopb.Echo{Text: "big", Payload: bytes.Repeat([]byte{1, 2, 3, 4}, 1<<10)}},
		{"unicode", &echopb.Echo{Text: "héllo, 世界 🚀"}},
	}
	out := make([]CodecSample, len(msgs))
	for i, m := range msgs {
		out[i] = CodecSample{
			Name:  m.name,
			Value: m.msg,
			New:   func() any { return new(echopb.Echo) },
			Equal: func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) },
		}
	}
	return out
}

// codecFault is the protobuf codec with the defects its non-nil fields
// give it; a nil field behaves as protobuf does.
type codecFault struct {
	name      func() string
	marshal   func(dst []byte, v any) ([]byte, error)
	unmarshal func(data []byte, v any) error
	size      func(v any) int
	aliases   bool
}

func (c *codecFault) Name() string {
	if c.name != nil {
		return c.name()
	}
	return protobuf.Name
}

func (c *codecFault) Marshal(dst []byte, v any) ([]byte, error) {
	if c.marshal != nil {
		return c.marshal(dst, v)
	}
	return protobuf.Codec{}.Marshal(dst, v)
}

func (c *codecFault) Unmarshal(data []byte, v any) error {
	if c.unmarshal != nil {
		return c.unmarshal(data, v)
	}
	return protobuf.Codec{}.Unmarshal(data, v)
}

func (c *codecFault) Size(v any) int {
	if c.size != nil {
		return c.size(v)
	}
	return protobuf.Codec{}.Size(v)
}

func (c *codecFault) AliasesInput() bool { return c.aliases }

// codecInPlaceFault adds a faulty UnmarshalInPlace to a codec.
type codecInPlaceFault struct {
	*codecFault
	inPlace func(data []byte, v any) error
}

func (c codecInPlaceFault) UnmarshalInPlace(data []byte, v any) error { return c.inPlace(data, v) }

// codecSizedFault adds a faulty MarshalSized to a codec.
type codecSizedFault struct {
	*codecFault
	sized func(dst []byte, v any, size int) ([]byte, error)
}

func (c codecSizedFault) MarshalSized(dst []byte, v any, size int) ([]byte, error) {
	return c.sized(dst, v, size)
}

// codecFreshFault adds a faulty UnmarshalFresh to a codec.
type codecFreshFault struct {
	*codecFault
	fresh func(data []byte, v any) error
}

func (c codecFreshFault) UnmarshalFresh(data []byte, v any) error { return c.fresh(data, v) }

// codecWithoutSize hides Size, to stand for a codec that is no CodecSizer.
type codecWithoutSize struct{ kernel.Codec }

// codecSizedWithoutSize has MarshalSized but no Size to tell it a size.
type codecSizedWithoutSize struct{ codecWithoutSize }

func (c codecSizedWithoutSize) MarshalSized(dst []byte, v any, _ int) ([]byte, error) {
	return c.Marshal(dst, v)
}

// codecFaultFactory registers nothing: it builds a fresh faulty codec per
// Build, as a factory would.
func codecFaultFactory(newCodec func() kernel.Codec) kernel.Factory[kernel.Codec] {
	return kernel.Factory[kernel.Codec]{
		Name: protobuf.Name,
		New:  func(any) (kernel.Codec, error) { return newCodec(), nil },
	}
}

// codecProtobufLenient is what the protobuf wire format allows.
var codecProtobufLenient = CodecLeniency{Prefixes: true, Concatenation: true}

func codecRecord(t *testing.T, f kernel.Factory[kernel.Codec], cfg CodecConfig) *recording {
	t.Helper()
	return record(t, "Codec", func(t tb) { codecSuite(t, f, cfg) })
}

// codecExpectClean fails t if the recorded suite failed anything: a good
// plugin must pass, or the suite cries wolf.
func codecExpectClean(t *testing.T, rec *recording) {
	t.Helper()
	for _, f := range rec.failures {
		t.Errorf("false positive: the suite failed %s on a good plugin: %s", f.path, f.msg)
	}
}

func TestCodecPassesTheProtobufCodec(t *testing.T) {
	rec := codecRecord(t, protobuf.Factory, CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient})
	codecExpectClean(t, rec)
	for _, path := range []string{"Codec/Size", "Codec/Aliasing", "Codec/Empty", "Codec/Nil", "Codec/Sized", "Codec/Fresh"} {
		if why := rec.skippedUnder(path); why != "" {
			t.Errorf("%s was skipped for the protobuf codec (%s); it has the capability", path, why)
		}
	}
}

func TestCodecPassesTheProtobufCodecAliasingRequests(t *testing.T) {
	rec := codecRecord(t, protobuf.Factory, CodecConfig{
		Options: map[string]any{"alias_requests": true},
		Samples: codecEchoSamples(),
		Lenient: codecProtobufLenient,
		// TestCodecPassesTheProtobufCodec runs the lengths in full.
		maxLength: 1<<16 + 1,
	})
	codecExpectClean(t, rec)
	if why := rec.skippedUnder("Codec/InPlace"); why != "" {
		t.Errorf("Codec/InPlace was skipped for protobuf with alias_requests (%s); it decodes in place", why)
	}
}

func TestCodecCatchesBrokenCodecs(t *testing.T) {
	var pb protobuf.Codec // the good codec each fault wraps
	cases := []struct {
		name  string
		codec func() kernel.Codec
		path  string // the subtest that must fail
	}{
		{"empty name", func() kernel.Codec { return &codecFault{name: func() string { return "" }} }, "Codec/Name"},
		{"name differs from the factory's", func() kernel.Codec { return &codecFault{name: func() string { return "proto" }} }, "Codec/Name"},
		{"name changes between calls", func() kernel.Codec {
			var n atomic.Int64
			return &codecFault{name: func() string { return "protobuf-" + strconv.FormatInt(n.Add(1), 10) }}
		}, "Codec/Name"},
		{"name differs between instances", codecCountingNames(), "Codec/Name"},
		{"marshal loses a field", func() kernel.Codec {
			return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
				m, ok := v.(*echopb.Echo)
				if !ok || m == nil {
					return pb.Marshal(dst, v)
				}
				return pb.Marshal(dst, &echopb.Echo{Payload: m.Payload})
			}}
		}, "Codec/RoundTrip"},
		{"empty input refused", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				if len(data) == 0 {
					return errors.New("no bytes to decode")
				}
				return pb.Unmarshal(data, v)
			}}
		}, "Codec/Empty"},
		{"marshal of nil panics", func() kernel.Codec {
			return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
				return pb.Marshal(dst, v.(proto.Message)) // no ok: a nil interface panics
			}}
		}, "Codec/Nil"},
		{"unmarshal into a nil pointer panics", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				m, ok := v.(proto.Message)
				if !ok {
					return errors.New("not a message")
				}
				return proto.Unmarshal(data, m) // no IsValid check: a typed nil panics
			}}
		}, "Codec/Nil"},
		{"unmarshal into nil succeeds", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				if v == nil {
					return nil
				}
				return pb.Unmarshal(data, v)
			}}
		}, "Codec/Nil"},
		{"marshal writes over dst in place", func() kernel.Codec {
			return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
				if len(dst) > 0 {
					dst[0] = 0 // a header "reserved" by the codec
				}
				return pb.Marshal(dst, v)
			}}
		}, "Codec/Append"},
		{"marshal drops dst", func() kernel.Codec {
			return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) { return pb.Marshal(dst[:0], v) }}
		}, "Codec/Append"},
		{"unmarshal trusts a length prefix", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				if len(data) >= 2 && data[0] == 0x0a { // field 1, length-delimited
					_ = data[2 : 2+int(data[1])] // panics when the input is cut short
				}
				return pb.Unmarshal(data, v)
			}}
		}, "Codec/Truncated"},
		{"unmarshal indexes by field number without checking it", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				var handlers [32]int
				if len(data) > 0 {
					_ = handlers[int(data[0]>>3)-1] // field number 0 panics
				}
				return pb.Unmarshal(data, v)
			}}
		}, "Codec/Random"},
		{"marshal keeps the message in the codec", func() kernel.Codec {
			var mu sync.Mutex
			var cur any
			return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
				mu.Lock()
				cur = v
				mu.Unlock()
				runtime.Gosched() // another call may replace cur meanwhile
				mu.Lock()
				v = cur
				mu.Unlock()
				return pb.Marshal(dst, v)
			}}
		}, "Codec/Concurrent"},
		{"size too small", func() kernel.Codec {
			return &codecFault{size: func(v any) int { return pb.Size(v) / 2 }}
		}, "Codec/Size"},
		{"unmarshal aliases its input without saying so", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				if err := pb.Unmarshal(data, v); err != nil {
					return err
				}
				// Point the payload into data instead of keeping a copy.
				if m, ok := v.(*echopb.Echo); ok && len(m.Payload) > 0 {
					if i := bytes.Index(data, m.Payload); i >= 0 {
						m.Payload = data[i : i+len(m.Payload)]
					}
				}
				return nil
			}}
		}, "Codec/Aliasing"},
		{"in-place decode loses the text", func() kernel.Codec {
			return codecInPlaceFault{&codecFault{}, func(data []byte, v any) error {
				if err := pb.Unmarshal(data, v); err != nil {
					return err
				}
				if m, ok := v.(*echopb.Echo); ok {
					m.Text = ""
				}
				return nil
			}}
		}, "Codec/InPlace"},
		{"in-place decode panics", func() kernel.Codec {
			return codecInPlaceFault{&codecFault{}, func([]byte, any) error { panic("in place") }}
		}, "Codec/InPlace"},
		{"sized marshal cuts the encoding to the size it is given", func() kernel.Codec {
			return codecSizedFault{&codecFault{}, func(dst []byte, v any, size int) ([]byte, error) {
				out, err := pb.Marshal(dst, v)
				return out[:min(len(out), len(dst)+size)], err
			}}
		}, "Codec/Sized"},
		{"sized marshal with no Size to give it a size", func() kernel.Codec {
			return codecSizedWithoutSize{codecWithoutSize{&codecFault{}}}
		}, "Codec/Sized"},
		{"sized marshal fails at the size Size gives", func() kernel.Codec {
			return codecSizedFault{&codecFault{}, func([]byte, any, int) ([]byte, error) {
				return nil, errors.New("broken: no room")
			}}
		}, "Codec/Sized"},
		{"sized marshal drops what dst held", func() kernel.Codec {
			return codecSizedFault{&codecFault{}, func(_ []byte, v any, _ int) ([]byte, error) { return pb.Marshal(nil, v) }}
		}, "Codec/Sized"},
		{"sized marshal drops the text when told another size", func() kernel.Codec {
			return codecSizedFault{&codecFault{}, func(dst []byte, v any, size int) ([]byte, error) {
				if m, ok := v.(*echopb.Echo); ok && size != pb.Size(v) && m.Text != "" {
					v = &echopb.Echo{Payload: m.Payload}
				}
				return pb.Marshal(dst, v)
			}}
		}, "Codec/Sized"},
		{"size panics on nil", func() kernel.Codec {
			return &codecFault{size: func(v any) int {
				if m, ok := v.(*echopb.Echo); v == nil || ok && m == nil {
					panic("nil message")
				}
				return pb.Size(v)
			}}
		}, "Codec/Nil"},
		{"fresh decode loses the text", func() kernel.Codec {
			return codecFreshFault{&codecFault{}, func(data []byte, v any) error {
				err := pb.UnmarshalFresh(data, v)
				if m, ok := v.(*echopb.Echo); ok {
					m.Text = ""
				}
				return err
			}}
		}, "Codec/Fresh"},
		{"fresh decode panics on a cut encoding", func() kernel.Codec {
			return codecFreshFault{&codecFault{}, func(data []byte, v any) error {
				err := pb.UnmarshalFresh(data, v)
				if err != nil {
					// As a decoder that trusts a length prefix and
					// reads past the end of what arrived.
					end := len(data) + 1
					return fmt.Errorf("field ends at %d, after byte %#x: %w", end, data[end-1], err)
				}
				return nil
			}}
		}, "Codec/Fresh"},
		{"sized marshal writes into as many bytes as it is told", func() kernel.Codec {
			return codecSizedFault{&codecFault{}, func(dst []byte, v any, size int) ([]byte, error) {
				enc, err := pb.Marshal(nil, v)
				out := append(dst, make([]byte, size)...)
				for i, b := range enc {
					out[len(dst)+i] = b // past the end when told too few
				}
				return out, err
			}}
		}, "Codec/Sized"},
		{"fresh decode aliases its input without saying so", func() kernel.Codec {
			return codecFreshFault{&codecFault{}, func(data []byte, v any) error {
				if err := pb.UnmarshalFresh(data, v); err != nil {
					return err
				}
				// As Aliasing's unmarshal case: only UnmarshalFresh
				// points into data, which the kernel recycles after it.
				if m, ok := v.(*echopb.Echo); ok && len(m.Payload) > 0 {
					if i := bytes.Index(data, m.Payload); i >= 0 {
						m.Payload = data[i : i+len(m.Payload)]
					}
				}
				return nil
			}}
		}, "Codec/Aliasing"},
		{"fresh decode stops at what cannot be a field", func() kernel.Codec {
			return codecFreshFault{&codecFault{}, func(data []byte, v any) error {
				return pb.UnmarshalFresh(codecUpToBadTag(data), v)
			}}
		}, "Codec/Fresh"},
		{"in-place decode trusts a length prefix", func() kernel.Codec {
			return codecInPlaceFault{&codecFault{}, func(data []byte, v any) error {
				if len(data) >= 2 && data[0] == 0x0a { // field 1, length-delimited
					_ = data[2 : 2+int(data[1])] // panics when the request is cut short
				}
				return pb.Unmarshal(data, v)
			}}
		}, "Codec/InPlace"},
		{"in-place decode stops at what cannot be a field", func() kernel.Codec {
			return codecInPlaceFault{&codecFault{}, func(data []byte, v any) error {
				return pb.Unmarshal(codecUpToBadTag(data), v)
			}}
		}, "Codec/InPlace"},
		{"fresh decode takes a cut encoding for a message", func() kernel.Codec {
			return codecFreshFault{&codecFault{}, func(data []byte, v any) error {
				_ = pb.UnmarshalFresh(data, v)
				return nil
			}}
		}, "Codec/Fresh"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Their defects are not in lengths: megabyte values would only
			// cost time.
			cfg := CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1}
			rec := codecRecord(t, codecFaultFactory(tc.codec), cfg)
			expectCaught(t, rec, tc.path)
		})
	}
}

// codecUpToBadTag is data up to the first place where a protobuf field
// should start and none can (field number 0, a tag cut short): a decoder
// that takes that for the end of the message accepts junk after it, while
// it still refuses a field cut short, as Unmarshal does.
func codecUpToBadTag(data []byte) []byte {
	for off := 0; off < len(data); {
		num, typ, n := protowire.ConsumeTag(data[off:])
		if n < 0 || num == 0 {
			return data[:off]
		}
		m := protowire.ConsumeFieldValue(num, typ, data[off+n:])
		if m < 0 {
			return data // cut inside a field: left for the decoder to refuse
		}
		off += n + m
	}
	return data
}

// A Marshal that panics fails the round trip, saying so, instead of
// crashing the test binary.
func TestCodecMarshalPanicIsAFailureNotACrash(t *testing.T) {
	f := codecFaultFactory(func() kernel.Codec {
		return &codecFault{marshal: func(dst []byte, v any) ([]byte, error) {
			if m, ok := v.(*echopb.Echo); ok && m != nil && len(m.Payload) > 0 {
				var fixed [64]byte
				_ = fixed[:len(m.Payload)] // a fixed scratch buffer: out of range past 64 bytes
			}
			return protobuf.Codec{}.Marshal(dst, v)
		}}
	})
	rec := codecRecord(t, f, CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1})
	expectCaught(t, rec, "Codec/RoundTrip")
	expectMessage(t, rec, "Codec/RoundTrip", "panicked: runtime error: slice bounds out of range")
}

// codecCountingNames builds codecs named after how many were built before.
func codecCountingNames() func() kernel.Codec {
	var built atomic.Int64
	return func() kernel.Codec {
		name := protobuf.Name
		if built.Add(1) > 1 {
			name += "-" + strconv.FormatInt(built.Load(), 10)
		}
		return &codecFault{name: func() string { return name }}
	}
}

func TestCodecSkipsWhatTheCodecDoesNotClaim(t *testing.T) {
	t.Run("no Size", func(t *testing.T) {
		f := codecFaultFactory(func() kernel.Codec { return codecWithoutSize{protobuf.Codec{}} })
		rec := codecRecord(t, f, CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Codec/Size"); !strings.Contains(why, "CodecSizer") {
			t.Errorf("Codec/Size skip reason = %q, want it to say the codec is no kernel.CodecSizer", why)
		}
	})
	t.Run("declared aliasing", func(t *testing.T) {
		// The same aliasing decoder as above, declared: the suite must not
		// hold it against the codec.
		f := codecFaultFactory(func() kernel.Codec {
			return &codecFault{aliases: true, unmarshal: func(data []byte, v any) error {
				if err := (protobuf.Codec{}).Unmarshal(data, v); err != nil {
					return err
				}
				if m, ok := v.(*echopb.Echo); ok && len(m.Payload) > 0 {
					if i := bytes.Index(data, m.Payload); i >= 0 {
						m.Payload = data[i : i+len(m.Payload)]
					}
				}
				return nil
			}}
		})
		rec := codecRecord(t, f, CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient, maxLength: 1<<16 + 1})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Codec/Aliasing"); !strings.Contains(why, "AliasesInput") {
			t.Errorf("Codec/Aliasing skip reason = %q, want it to name AliasesInput", why)
		}
	})
}

func TestCodecNeedsSamples(t *testing.T) {
	rec := codecRecord(t, protobuf.Factory, CodecConfig{})
	expectCaught(t, rec, "Codec")
	if len(rec.failures) == 0 || !strings.Contains(rec.failures[0].msg, "Samples") {
		t.Errorf("failures %v; want one saying CodecConfig.Samples is empty", rec.failures)
	}
}

func TestCodecDefaultEqualDereferences(t *testing.T) {
	type point struct{ X, Y int }
	s := CodecSample{Value: point{1, 2}, New: func() any { return new(point) }}
	if !codecEqual(s, point{1, 2}, &point{1, 2}) {
		t.Error("a value and a pointer to an equal value compare unequal; the default Equal must dereference got")
	}
	if codecEqual(s, point{1, 2}, &point{1, 3}) {
		t.Error("different points compare equal")
	}
}

func TestCodecPrefixLengths(t *testing.T) {
	if got := codecPrefixLengths(3); len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Errorf("codecPrefixLengths(3) = %v, want [0 1 2]", got)
	}
	const size = 1 << 16
	got := codecPrefixLengths(size)
	if len(got) > codecTruncatedMax+codecTruncatedMax/4 {
		t.Errorf("codecPrefixLengths(%d) tries %d prefixes, want about %d", size, len(got), codecTruncatedMax)
	}
	slices.Sort(got)
	if got[0] != 0 || got[1] != 1 || got[len(got)-1] != size-1 {
		t.Errorf("codecPrefixLengths(%d) does not try the shortest and longest prefixes: starts %v, ends %d", size, got[:2], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if gap := got[i] - got[i-1]; gap > size/128 {
			t.Errorf("prefixes %d and %d leave a gap of %d bytes untried; want an even spread", got[i-1], got[i], gap)
		}
	}
}
