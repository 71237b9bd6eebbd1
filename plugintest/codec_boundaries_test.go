package plugintest

import (
	"bytes"
	encjson "encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/json"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// codecPlain is a plain struct with every kind of field a JSON or
// MessagePack codec decodes in its own way: a map, a slice, bytes, text.
type codecPlain struct {
	Name  string            `json:"name"`
	Tags  map[string]string `json:"tags"`
	Items []string          `json:"items"`
	Blob  []byte            `json:"blob"`
	Count int               `json:"count"`
}

func codecPlainSamples() []CodecSample {
	newPlain := func() any { return new(codecPlain) }
	return []CodecSample{
		{Name: "full", Value: codecPlain{Name: "Zoë ✓", Tags: map[string]string{"a": "1", "ß": "2"}, Items: []string{"x", "y"}, Blob: []byte{0, 0xff}, Count: -3}, New: newPlain},
		{Name: "sparse", Value: codecPlain{Tags: map[string]string{"only": "one"}}, New: newPlain},
	}
}

// codecJSONFault is the json codec with the Unmarshal its field gives it.
type codecJSONFault struct {
	kernel.Codec
	unmarshal func(data []byte, v any) error
}

func (c codecJSONFault) Unmarshal(data []byte, v any) error { return c.unmarshal(data, v) }

func codecJSON(t *testing.T) kernel.Codec {
	t.Helper()
	c, err := json.Factory.Build(nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A good strict codec passes the strict checks: the suite does not refuse
// what JSON defines as valid (trailing white space, say).
func TestCodecPassesTheJSONCodec(t *testing.T) {
	// Lengths capped: the json package's own test runs them in full.
	cfg := CodecConfig{Samples: codecPlainSamples(), maxLength: 1<<16 + 1}
	rec := record(t, "Codec", func(t tb) { codecSuite(t, json.Factory, cfg) })
	codecExpectClean(t, rec)
	for _, path := range []string{"Codec/Trailing", "Codec/Garbage", "Codec/Lengths", "Codec/Reuse", "Codec/Empty"} {
		if why := rec.skippedUnder(path); why != "" {
			t.Errorf("%s was skipped for the json codec (%s); it applies", path, why)
		}
	}
}

// TestCodecCatchesBoundaryDefects: defects that only show at the edges
// of the input space, each a correct codec with one bug, caught by the
// subtest of the property it breaks.
func TestCodecCatchesBoundaryDefects(t *testing.T) {
	var pb protobuf.Codec
	small := func() []CodecSample { return codecEchoSamples()[:1] } // "small" only: no length crosses 127
	// Megabyte lengths only where the defect is in a length: the others
	// would spend seconds of -race on them for nothing.
	const capped = 1<<16 + 1
	cases := []struct {
		name  string
		codec func() kernel.Codec
		cfg   CodecConfig // zero: the echo samples, with protobuf's leniency
		path  string
	}{
		{"decoder reads at most three bytes of a length varint", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				if err := pb.Unmarshal(data, v); err != nil {
					return err
				}
				// What a hand-written decoder that stops after three
				// varint bytes makes of a length of 2 MiB or more.
				if m, ok := v.(*echopb.Echo); ok && len(m.Payload) >= 1<<21 {
					m.Payload = m.Payload[:len(m.Payload)&(1<<21-1)]
				}
				return nil
			}}
		}, CodecConfig{}, "Codec/Lengths"},
		{"size counts every length prefix as one byte", func() kernel.Codec {
			return &codecFault{size: func(v any) int {
				m, ok := v.(*echopb.Echo)
				if !ok {
					return pb.Size(v)
				}
				n := 0
				for _, f := range [][]byte{m.GetPayload(), []byte(m.GetText())} {
					if len(f) > 0 {
						n += 2 + len(f) // a tag and "a length": one byte each
					}
				}
				return n
			}}
		}, CodecConfig{Samples: small()}, "Codec/Size"},
		{"unmarshal merges into the target", func() kernel.Codec {
			return &codecFault{unmarshal: func(data []byte, v any) error {
				return proto.UnmarshalOptions{Merge: true}.Unmarshal(data, v.(proto.Message))
			}}
		}, CodecConfig{}, "Codec/Reuse"},
		{"json: unmarshal keeps the map entries the target had", func() kernel.Codec {
			return codecJSONFault{codecJSON(t), func(data []byte, v any) error {
				return encjson.Unmarshal(data, v) // merges into maps; no reset
			}}
		}, CodecConfig{Samples: codecPlainSamples()}, "Codec/Reuse"},
		{"json: unmarshal ignores what follows the value", func() kernel.Codec {
			return codecJSONFault{codecJSON(t), func(data []byte, v any) error {
				dec := encjson.NewDecoder(bytes.NewReader(data))
				if err := dec.Decode(v); err != nil {
					return err
				}
				return nil
			}}
		}, CodecConfig{Samples: codecPlainSamples()}, "Codec/Trailing"},
		{"json: unmarshal reads values until the input ends, keeping the last", func() kernel.Codec {
			return codecJSONFault{codecJSON(t), func(data []byte, v any) error {
				dec := encjson.NewDecoder(bytes.NewReader(data))
				for {
					if err := dec.Decode(v); err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
				}
			}}
		}, CodecConfig{Samples: codecPlainSamples()}, "Codec/Trailing"},
		{"json: unmarshal takes input cut short as the end of the message", func() kernel.Codec {
			c := codecJSON(t)
			return codecJSONFault{c, func(data []byte, v any) error {
				err := c.Unmarshal(data, v)
				var syn *encjson.SyntaxError
				if errors.Is(err, io.ErrUnexpectedEOF) || (errors.As(err, &syn) && strings.Contains(syn.Error(), "unexpected end")) {
					return nil // "the peer sent what it had"
				}
				return err
			}}
		}, CodecConfig{Samples: codecPlainSamples()}, "Codec/Truncated"},
		{"json: unmarshal skips to the first brace and takes no brace for no message", func() kernel.Codec {
			c := codecJSON(t)
			return codecJSONFault{c, func(data []byte, v any) error {
				if len(data) > 0 {
					i := bytes.IndexByte(data, '{')
					if i < 0 {
						return nil
					}
					data = data[i:]
				}
				return c.Unmarshal(data, v)
			}}
		}, CodecConfig{Samples: codecPlainSamples()}, "Codec/Garbage"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Samples == nil {
				cfg = CodecConfig{Samples: codecEchoSamples(), Lenient: codecProtobufLenient}
			}
			if tc.path != "Codec/Lengths" {
				cfg.maxLength = capped
			}
			rec := codecRecord(t, codecFaultFactory(tc.codec), cfg)
			expectCaught(t, rec, tc.path)
		})
	}
}

// What the suite cannot check fails, saying what to configure, instead
// of passing unchecked.
func TestCodecFailsWhatItCannotCheck(t *testing.T) {
	t.Run("zero value it cannot make", func(t *testing.T) {
		s := codecEchoSamples()[0]
		s.Value = &emptypb.Empty{} // not what New returns
		s.Equal = func(any, any) bool { return true }
		rec := codecRecord(t, protobuf.Factory, CodecConfig{Samples: []CodecSample{s}, Lenient: codecProtobufLenient})
		expectCaught(t, rec, "Codec/Empty")
		if why := rec.skippedUnder("Codec/Empty"); why != "" {
			t.Errorf("Codec/Empty skipped (%s); it must fail, saying what to give", why)
		}
	})
	t.Run("no length it can set", func(t *testing.T) {
		empty := CodecSample{Name: "empty", Value: &emptypb.Empty{}, New: func() any { return new(emptypb.Empty) },
			Equal: func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }}
		rec := codecRecord(t, protobuf.Factory, CodecConfig{Samples: []CodecSample{empty}, Lenient: codecProtobufLenient})
		expectCaught(t, rec, "Codec/Lengths")
		found := false
		for _, f := range rec.failures {
			found = found || (f.path == "Codec/Lengths" && strings.Contains(f.msg, "Sized"))
		}
		if !found {
			t.Errorf("failures %v; want one in Codec/Lengths saying to give CodecSample.Sized", rec.failures)
		}
	})
	t.Run("Sized stands in for fields", func(t *testing.T) {
		empty := CodecSample{Name: "sized", Value: &emptypb.Empty{}, New: func() any { return new(echopb.Echo) },
			Equal: func(want, got any) bool { return proto.Equal(want.(proto.Message), got.(proto.Message)) }}
		empty.Value = &echopb.Echo{}
		empty.Sized = func(n int) any { return &echopb.Echo{Payload: bytes.Repeat([]byte{1}, n)} }
		rec := codecRecord(t, protobuf.Factory, CodecConfig{Samples: []CodecSample{empty}, Lenient: codecProtobufLenient})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Codec/Lengths"); why != "" {
			t.Errorf("Codec/Lengths skipped for a sample with Sized: %s", why)
		}
	})
}

// A leniency the format has is declared, and the checks it exempts are
// skipped naming it; undeclared, the protobuf codec's valid prefixes and
// concatenations fail.
func TestCodecLeniencyIsDeclared(t *testing.T) {
	rec := codecRecord(t, protobuf.Factory, CodecConfig{Samples: codecEchoSamples(), maxLength: 1<<16 + 1})
	expectCaught(t, rec, "Codec/Truncated")
	expectCaught(t, rec, "Codec/Trailing/small/Repeated")
	if rec.failedUnder("Codec/Trailing/small/Junk") || rec.failedUnder("Codec/Garbage") {
		t.Errorf("protobuf refuses junk after a message and garbage, yet the suite failed it: %v", rec.failures)
	}
	rec = codecRecord(t, protobuf.Factory, CodecConfig{Samples: codecEchoSamples(), Lenient: CodecLeniency{AnyInput: true}, maxLength: 1<<16 + 1})
	codecExpectClean(t, rec)
	for _, path := range []string{"Codec/Trailing/small/Junk", "Codec/Trailing/small/Repeated", "Codec/Garbage"} {
		if why := rec.skippedUnder(path); !strings.Contains(why, "Lenient") {
			t.Errorf("%s with Lenient.AnyInput: skip reason %q, want one naming CodecConfig.Lenient", path, why)
		}
	}
}

// codecLengths crosses every width it claims to, on both sides.
func TestCodecLengthsCrossEveryVarintWidth(t *testing.T) {
	lengths := codecLengths(0)
	has := make(map[int]bool)
	for _, n := range lengths {
		has[n] = true
	}
	for width := 1; width <= 3; width++ {
		edge := 1 << (7 * width) // the first length needing width+1 bytes
		if protowire.SizeVarint(uint64(edge-1)) != width || protowire.SizeVarint(uint64(edge)) != width+1 {
			t.Fatalf("bad edge %d", edge)
		}
		if !has[edge-1] || !has[edge] {
			t.Errorf("codecLengths %v lacks %d or %d, the two sides of the %d-byte varint", lengths, edge-1, edge, width+1)
		}
	}
	for _, n := range []int{0, 1, 17, 1 << 14} {
		if got := codecText(n); len(got) != n || !strings.ContainsRune(codecText(1000), '✓') {
			t.Errorf("codecText(%d) is %d bytes", n, len(got))
		}
	}
}
