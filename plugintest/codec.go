package plugintest

import (
	"encoding/hex"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// CodecSample is one message a codec under test must round-trip.
type CodecSample struct {
	Name  string     // subtest name, e.g. "small", "64KiB"
	Value any        // what Marshal is given
	New   func() any // a fresh pointer for Unmarshal to decode into
	// Equal compares Value (want) with the pointer New returned once
	// Unmarshal has filled it (got). Nil means reflect.DeepEqual, with got
	// dereferenced when Value is not itself a pointer.
	Equal func(want, got any) bool
	// Sized returns a value of Value's type whose variable-length part (a
	// string, a bytes field, a repeated field) is n bytes or elements
	// long, for the Lengths and Size subtests. Nil lets the suite make
	// them itself: it sets each string and []byte field of a copy of
	// Value that it can reach (exported, through structs and pointers)
	// and that the codec carries. Give Sized for a sample with no such
	// field (a FlatBuffers table, a value with only unexported fields).
	Sized func(n int) any
}

// CodecLeniency declares inputs that look invalid but that the codec's
// wire format defines as valid, so that the suite does not require the
// codec to refuse them. The zero value declares none: a strict format, in
// which every proper prefix of an encoding, an encoding followed by any
// other bytes, and garbage are errors (JSON and MessagePack are such
// formats). Declare only what the format allows, not what the codec
// happens to accept: a JSON codec that ignores what follows the value has
// a bug the suite is there to catch.
type CodecLeniency struct {
	// Prefixes: a prefix of an encoding can itself be a valid encoding.
	// Protobuf: cut at a field boundary, an encoding is the message
	// without its later fields. FlatBuffers: cut in the padding after the
	// last object, a buffer still verifies. The Truncated subtests then
	// only require that no prefix makes the codec panic.
	Prefixes bool
	// Concatenation: two encodings one after the other are one valid
	// encoding (protobuf merges them into one message). Skips
	// Trailing/<sample>/Repeated.
	Concatenation bool
	// TrailingBytes: the format ignores whatever follows a complete
	// encoding (FlatBuffers reads only what its root offset leads to).
	// Implies Concatenation; skips the Trailing subtests.
	TrailingBytes bool
	// AnyInput: every byte string is a valid encoding (a codec of raw
	// bytes). Implies the others; skips the Garbage subtest too.
	AnyInput bool
}

// CodecConfig configures the Codec suite.
type CodecConfig struct {
	// Options is the codec's options block, as a config file would give it;
	// nil builds the codec from its defaults.
	Options map[string]any
	// Samples are the messages the codec must round-trip; at least one. Give
	// a small one, a large one and one with every kind of field the codec
	// handles specially (unicode text, nested messages, ...).
	Samples []CodecSample
	// Lenient declares the invalid-looking inputs the codec's format
	// accepts; the zero value, a strict format, suits JSON and
	// MessagePack. protobuf declares Prefixes and Concatenation,
	// FlatBuffers Prefixes and TrailingBytes.
	Lenient CodecLeniency

	// maxLength caps the Lengths subtests' lengths; 0 means no cap. The
	// self-test sets it for broken plugins whose defect is elsewhere,
	// which need not spend seconds on megabyte values.
	maxLength int
}

// Codec certifies the codec f builds. It checks, in subtests of those names:
//
//   - Name: Name is non-empty, equals f.Name, and is the same across calls
//     and across two built codecs (the name travels in every request).
//   - RoundTrip/<sample>: every sample decodes to a value equal to itself.
//   - Empty/<sample>: the zero value of each sample's type round-trips. A
//     sample whose Value is neither New's type nor what New points to
//     fails: the suite cannot make its zero value.
//   - Nil/<sample>: Marshal of a nil interface and of a typed nil pointer
//     returns an error or an encoding, and Unmarshal into either returns an
//     error; neither panics, and neither does Size.
//   - Append/<sample>: Marshal appends, leaving dst[:len(dst)] untouched,
//     whether dst has spare capacity or none, and the appended bytes decode
//     to the sample.
//   - Truncated/<sample>: every proper prefix of the encoding (a bounded
//     number of them for large samples) is an error, never a panic. A
//     prefix that is the encoding of the zero value may decode; with
//     CodecConfig.Lenient.Prefixes any prefix may, as long as none panics.
//   - Trailing/<sample>/Junk: the encoding followed by bytes that continue
//     no encoding (0x00, 0xff, eleven 0xff) is an error. Skipped with
//     Lenient.TrailingBytes.
//   - Trailing/<sample>/Repeated: the encoding twice over is an error.
//     Skipped with Lenient.Concatenation or Lenient.TrailingBytes.
//   - Garbage: input that no format encodes a message as (a lone 0x00,
//     sixteen of them, eleven 0xff, the unused MessagePack byte 0xc1) is an
//     error for every sample type. Skipped with Lenient.AnyInput.
//   - Random/<sample>: random bytes and mutated encodings give an error or a
//     value, never a panic. A failure prints the input in hex.
//   - Lengths/<sample>: for one sample of each Go type (the first that
//     gives CodecSample.Sized, else the first), copies whose strings and
//     bytes fields (or Sized values) are 0 and 1 long and on both sides of
//     every width a length is commonly encoded in (15/16, 31/32, 127/128,
//     255/256, 16383/16384, 65535/65536, 2 MiB - 1 and 2 MiB; with
//     -plugintest.long also 16 MiB and 256 MiB, which takes seconds and
//     about 2 GB of memory) round-trip. Fails if no
//     sample has such a field and none gives Sized; skipped, saying so,
//     for a sample without.
//   - Reuse/<sample>: Unmarshal into a target that already holds another
//     value (one the suite fills: every exported field set, an extra map
//     entry and slice element; and each other sample of the same type)
//     leaves exactly the sample, and the zero value's encoding decoded
//     into a target holding the sample leaves the zero value: Unmarshal
//     replaces what v held, it does not merge into it.
//   - Concurrent: one codec used by many goroutines at once, each with its
//     own messages, still round-trips every message. Run with -race.
//   - Size/<sample>: if the codec is a kernel.CodecSizer, Size is at least
//     the encoded length, for the sample and, if Lengths resizes it, for
//     each of its copies there, whose lengths cross the widths a
//     hand-written Size may miscount (the kernel sizes the buffer it asks the transport
//     for by it; a larger value is allowed, a smaller one defeats it).
//     Skipped for codecs without Size.
//   - Aliasing/<sample>: unless the codec declares kernel.AliasingCodec,
//     overwriting the input after Unmarshal, and after UnmarshalFresh for a
//     kernel.FreshUnmarshaler, does not change the decoded value, since
//     the kernel then recycles that input at once. Skipped for codecs that
//     declare AliasesInput.
//   - InPlace/<sample>: if the codec is a kernel.InPlaceUnmarshaler,
//     UnmarshalInPlace decodes every sample to a value equal to itself,
//     and refuses, without panicking, every input Unmarshal refuses of
//     those Truncated, Trailing and Garbage try (the server decodes every
//     request with it). Skipped for other codecs.
//   - Sized/<sample>: if the codec is a kernel.SizedMarshaler, MarshalSized
//     given the size Size just took appends an encoding of the sample, and
//     given that size less or more by one (the value changed since Size)
//     fails or still appends an encoding of the sample, never a corrupt
//     one. Skipped for other codecs.
//   - Fresh/<sample>: if the codec is a kernel.FreshUnmarshaler,
//     UnmarshalFresh into a value New has just made decodes every sample,
//     and refuses, without panicking, every input Unmarshal refuses of
//     those Truncated, Trailing and Garbage try. Skipped for other codecs.
//   - Lifecycle and Options, as for every plugin kind, using the codec to
//     round-trip the first sample.
func Codec(t *testing.T, f kernel.Factory[kernel.Codec], cfg CodecConfig) {
	t.Helper()
	codecSuite(wrap(t), f, cfg)
}

func codecSuite(t tb, f kernel.Factory[kernel.Codec], cfg CodecConfig) {
	t.Helper()
	if len(cfg.Samples) == 0 {
		t.Fatalf("CodecConfig.Samples is empty: give the suite at least one message %q encodes", f.Name)
	}
	for i, s := range cfg.Samples {
		if s.Name == "" || s.New == nil || s.Value == nil {
			t.Fatalf("CodecConfig.Samples[%d] (%q) needs a Name, a non-nil Value and a New", i, s.Name)
		}
	}
	c := build(t, f, cfg.Options)
	t.Cleanup(func() { closePlugin(c) })

	t.Run("Name", func(t tb) { codecName(t, f, cfg, c) })
	codecEachSample(t, "RoundTrip", cfg.Samples, func(t tb, s CodecSample) { codecRoundTrip(t, c, s) })
	codecEachSample(t, "Empty", cfg.Samples, func(t tb, s CodecSample) { codecEmpty(t, c, s) })
	codecEachSample(t, "Nil", codecDistinctTypes(cfg.Samples), func(t tb, s CodecSample) { codecNil(t, c, s) })
	codecEachSample(t, "Append", cfg.Samples, func(t tb, s CodecSample) { codecAppend(t, c, s) })
	codecEachSample(t, "Truncated", cfg.Samples, func(t tb, s CodecSample) { codecTruncated(t, c, s, cfg.Lenient) })
	codecEachSample(t, "Trailing", cfg.Samples, func(t tb, s CodecSample) { codecTrailing(t, c, s, cfg.Lenient) })
	t.Run("Garbage", func(t tb) { codecGarbage(t, c, codecDistinctTypes(cfg.Samples), cfg.Lenient) })
	codecEachSample(t, "Random", cfg.Samples, func(t tb, s CodecSample) { codecRandom(t, c, s) })
	var measured codecMeasurements
	codecLengthsProperty(t, c, cfg.Samples, cfg.maxLength, &measured)
	codecEachSample(t, "Reuse", cfg.Samples, func(t tb, s CodecSample) { codecReuse(t, c, s, cfg.Samples) })
	t.Run("Concurrent", func(t tb) { codecConcurrent(t, c, cfg.Samples) })
	codecEachSample(t, "Size", cfg.Samples, func(t tb, s CodecSample) { codecSize(t, c, s, codecResized(s, cfg.Samples), cfg.maxLength, &measured) })
	codecEachSample(t, "Aliasing", cfg.Samples, func(t tb, s CodecSample) { codecAliasing(t, c, s) })
	codecEachSample(t, "InPlace", cfg.Samples, func(t tb, s CodecSample) { codecInPlace(t, c, s) })
	codecEachSample(t, "Sized", cfg.Samples, func(t tb, s CodecSample) { codecSized(t, c, s) })
	codecEachSample(t, "Fresh", cfg.Samples, func(t tb, s CodecSample) { codecFresh(t, c, s) })

	lifecycle(t, f, cfg.Options, func(t tb, c kernel.Codec) {
		t.Helper()
		codecRoundTrip(t, c, cfg.Samples[0])
	})
}

func codecEachSample(t tb, property string, samples []CodecSample, check func(t tb, s CodecSample)) {
	t.Run(property, func(t tb) {
		for _, s := range samples {
			t.Run(s.Name, func(t tb) { check(t, s) })
		}
	})
}

func codecName(t tb, f kernel.Factory[kernel.Codec], cfg CodecConfig, c kernel.Codec) {
	name := c.Name()
	if name == "" {
		t.Fatalf("Name() is empty; the codec's name travels in every request and must name it")
	}
	if name != f.Name {
		t.Errorf("Name() = %q, but the factory registers %q; a server finds the codec a request names by the factory's name", name, f.Name)
	}
	if again := c.Name(); again != name {
		t.Errorf("Name() changed between calls: %q then %q; it must be a constant", name, again)
	}
	other := build(t, f, cfg.Options)
	defer closePlugin(other)
	if o := other.Name(); o != name {
		t.Errorf("two codecs built from the same factory are named %q and %q; the name must not depend on the instance", name, o)
	}
}

// codecEqual compares a sample's value with what was decoded into got (the
// pointer New returned).
func codecEqual(s CodecSample, want, got any) bool {
	if s.Equal != nil {
		return s.Equal(want, got)
	}
	if reflect.TypeOf(want) != reflect.TypeOf(got) {
		if g := reflect.ValueOf(got); g.Kind() == reflect.Pointer && !g.IsNil() && g.Elem().Type() == reflect.TypeOf(want) {
			got = g.Elem().Interface()
		}
	}
	return reflect.DeepEqual(want, got)
}

// codecDecode unmarshals data into a fresh value from s.New, turning a panic
// into a failure that shows the input.
func codecDecode(t tb, c kernel.Codec, s CodecSample, data []byte) (any, bool) {
	t.Helper()
	return codecDecodeWith(t, "Unmarshal", c.Unmarshal, s, data)
}

// codecDecodeWith decodes data into a fresh value of the sample's type
// with unmarshal, named op in failures.
func codecDecodeWith(t tb, op string, unmarshal func([]byte, any) error, s CodecSample, data []byte) (any, bool) {
	t.Helper()
	got := s.New()
	if p := codecCatch(func() error { return unmarshal(data, got) }); p.panicked {
		t.Errorf("%s(%s) into %T panicked: %v", op, codecHex(data), got, p.value)
		return nil, false
	} else if p.err != nil {
		t.Errorf("%s of the codec's own encoding %s into %T: %v", op, codecHex(data), got, p.err)
		return nil, false
	}
	return got, true
}

func codecRoundTrip(t tb, c kernel.Codec, s CodecSample) {
	t.Helper()
	codecRoundTripWith(t, c, "Unmarshal", c.Unmarshal, s)
}

// codecRoundTripWith encodes the sample with Marshal and decodes it with
// unmarshal, named op in failures.
func codecRoundTripWith(t tb, c kernel.Codec, op string, unmarshal func([]byte, any) error, s CodecSample) {
	t.Helper()
	var data []byte
	p := codecCatch(func() (err error) { data, err = c.Marshal(nil, s.Value); return err })
	if p.panicked {
		t.Fatalf("Marshal(nil, %T) panicked: %v", s.Value, p.value)
	}
	if p.err != nil {
		t.Fatalf("Marshal(nil, %T): %v; the codec must encode every sample it is given", s.Value, p.err)
	}
	got, ok := codecDecodeWith(t, op, unmarshal, s, data)
	if ok && !codecEqual(s, s.Value, got) {
		t.Errorf("round trip of sample %q through Marshal and %s changed it: encoded %s, decoded %s, want %s",
			s.Name, op, codecHex(data), codecShow(got), codecShow(s.Value))
	}
}

func codecEmpty(t tb, c kernel.Codec, s CodecSample) {
	zero, ok := codecZero(s)
	if !ok {
		t.Fatalf("sample %q: Value is %T and New returns %T, so the suite cannot make the zero value of the sample's type; "+
			"give a Value of the type New returns, or of the type it points to", s.Name, s.Value, s.New())
	}
	empty := s
	empty.Value = zero
	codecRoundTrip(t, c, empty)
}

// codecZero returns the zero value of s's type in the shape the sample
// gives Marshal: a fresh pointer if Value is one, else what that pointer
// points to; ok is false if Value is neither.
func codecZero(s CodecSample) (zero any, ok bool) {
	zero = s.New()
	switch vt, pt := reflect.TypeOf(s.Value), reflect.TypeOf(zero); {
	case vt == pt:
		return zero, true
	case pt.Kind() == reflect.Pointer && vt == pt.Elem():
		return reflect.ValueOf(zero).Elem().Interface(), true
	}
	return nil, false
}

// codecZeroEncoding returns the encoding of the zero value of s's type,
// which a strict format may still accept where it refuses a prefix;
// ok is false if there is none.
func codecZeroEncoding(c kernel.Codec, s CodecSample) (data []byte, ok bool) {
	zero, ok := codecZero(s)
	if !ok {
		return nil, false
	}
	p := codecCatch(func() (err error) { data, err = c.Marshal(nil, zero); return err })
	return data, !p.panicked && p.err == nil
}

func codecNil(t tb, c kernel.Codec, s CodecSample) {
	nils := []struct {
		desc string
		v    any
	}{
		{"nil", nil},
		{fmt.Sprintf("a nil %T", s.New()), reflect.Zero(reflect.TypeOf(s.New())).Interface()},
	}
	for _, n := range nils {
		if p := codecCatch(func() error { _, err := c.Marshal([]byte("x"), n.v); return err }); p.panicked {
			t.Errorf("Marshal(dst, %s) panicked: %v; return an error (or the encoding of an empty message) instead", n.desc, p.value)
		}
		if sz, ok := c.(kernel.CodecSizer); ok {
			if p := codecCatch(func() error { sz.Size(n.v); return nil }); p.panicked {
				t.Errorf("Size(%s) panicked: %v; return 0 for a value the codec cannot encode", n.desc, p.value)
			}
		}
	}
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	for _, n := range nils {
		switch p := codecCatch(func() error { return c.Unmarshal(data, n.v) }); {
		case p.panicked:
			t.Errorf("Unmarshal into %s panicked: %v; return an error saying a pointer to a message is needed", n.desc, p.value)
		case p.err == nil:
			t.Errorf("Unmarshal into %s returned no error; there is nowhere to decode to, so it must fail", n.desc)
		}
	}
}

func codecAppend(t tb, c kernel.Codec, s CodecSample) {
	want, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	prefix := []byte("plugintest-prefix\x00\xff")
	cases := []struct {
		name  string
		spare int
	}{{"SpareCapacity", len(want) + 64}, {"NoCapacity", 0}}
	for _, tc := range cases {
		t.Run(tc.name, func(t tb) {
			dst := make([]byte, len(prefix), len(prefix)+tc.spare)
			copy(dst, prefix)
			out, err := c.Marshal(dst, s.Value)
			if err != nil {
				t.Fatalf("Marshal(dst with %d bytes, cap %d): %v", len(dst), cap(dst), err)
			}
			if string(dst) != string(prefix) {
				t.Errorf("Marshal changed dst[:len(dst)] in place: %q, want %q; it must only append", dst, prefix)
			}
			if len(out) < len(prefix) || string(out[:len(prefix)]) != string(prefix) {
				t.Fatalf("Marshal's result does not start with dst: got %s, want prefix %q; Marshal must append to dst, not replace it", codecHex(out), prefix)
			}
			tail := out[len(prefix):]
			if got, ok := codecDecode(t, c, s, tail); ok && !codecEqual(s, s.Value, got) {
				t.Errorf("the bytes appended after a prefix decode to %s, want %s", codecShow(got), codecShow(s.Value))
			}
		})
	}
}

const (
	codecGoroutines = 8
	codecCallsEach  = 24
)

func codecConcurrent(t tb, c kernel.Codec, samples []CodecSample) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range codecGoroutines {
		wg.Go(func() {
			<-start
			var buf []byte
			for i := range codecCallsEach {
				// Goroutines start on different samples, so that a codec
				// sharing state between calls mixes up different messages.
				s := samples[(g+i)%len(samples)]
				got := s.New()
				if !codecConcurrentStep(t, g, "Marshal", s, func() (err error) { buf, err = c.Marshal(buf[:0], s.Value); return err }) ||
					!codecConcurrentStep(t, g, "Unmarshal", s, func() error { return c.Unmarshal(buf, got) }) {
					return
				}
				if !codecEqual(s, s.Value, got) {
					t.Errorf("goroutine %d, call %d: sample %q decoded to %s while other goroutines used the codec; "+
						"keep no per-call state in the codec value", g, i, s.Name, codecShow(got))
					return
				}
				runtime.Gosched()
			}
		})
	}
	close(start)
	wg.Wait()
}

// codecConcurrentStep runs one of codecConcurrent's calls, op, on
// goroutine g, and reports its error or panic: a panic on a goroutine of
// the suite's own would crash the test binary.
func codecConcurrentStep(t tb, g int, op string, s CodecSample, call func() error) bool {
	switch o := codecCatch(call); {
	case o.panicked:
		t.Errorf("goroutine %d: %s(%q) panicked: %v", g, op, s.Name, o.value)
	case o.err != nil:
		t.Errorf("goroutine %d: %s(%q): %v", g, op, s.Name, o.err)
	default:
		return true
	}
	return false
}

func codecSize(t tb, c kernel.Codec, s CodecSample, resized bool, max int, measured *codecMeasurements) {
	sz, ok := c.(kernel.CodecSizer)
	if !ok {
		t.Skipf("%T does not implement kernel.CodecSizer", c)
	}
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	if n := sz.Size(s.Value); n < len(data) {
		t.Errorf("Size = %d, but Marshal wrote %d bytes; Size must not be smaller than the encoding, "+
			"or the buffer the kernel asks the transport for is too small", n, len(data))
	}
	// The Lengths copies cross every width a hand-written Size may count
	// wrong (a varint's byte count, a one- or two-byte length).
	if !resized {
		return
	}
	sizes, ok := measured.get(s.Name)
	if !ok {
		// Lengths did not run (or stopped early): measure here.
		seq, _ := codecVariants(t, c, s, max)
		if seq == nil {
			return
		}
		for v := range seq {
			if data, err := c.Marshal(nil, v.value); err == nil {
				sizes = append(sizes, codecMeasure(sz, v, data))
			}
		}
	}
	short := 0
	for _, m := range sizes {
		switch {
		case m.panicked != nil:
			t.Errorf("sample %q with %s: Size panicked: %v", s.Name, m.what, m.panicked)
		case m.sized < m.encoded:
			t.Errorf("sample %q with %s: Size = %d, but Marshal wrote %d bytes; Size must not be smaller than the encoding "+
				"at any length (count each length prefix at its encoded width)", s.Name, m.what, m.sized, m.encoded)
		default:
			continue
		}
		if short++; short == 3 {
			return
		}
	}
}

func codecAliasing(t tb, c kernel.Codec, s CodecSample) {
	if a, ok := c.(kernel.AliasingCodec); ok && a.AliasesInput() {
		t.Skipf("%T declares AliasesInput: its values may point into their input, which the kernel keeps unchanged for them", c)
	}
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	// UnmarshalFresh too: the kernel recycles the input of a typed
	// handler's request and a typed stream's message as soon as it
	// returns. (UnmarshalInPlace may alias: the server keeps its input.)
	type decoder struct {
		op        string
		unmarshal func([]byte, any) error
	}
	decoders := []decoder{{"Unmarshal", c.Unmarshal}}
	if fu, ok := c.(kernel.FreshUnmarshaler); ok {
		decoders = append(decoders, decoder{"UnmarshalFresh", fu.UnmarshalFresh})
	}
	for _, d := range decoders {
		in := append([]byte(nil), data...)
		got, ok := codecDecodeWith(t, d.op, d.unmarshal, s, in)
		if !ok {
			continue
		}
		for i := range in {
			in[i] = ^in[i]
		}
		if !codecEqual(s, s.Value, got) {
			t.Errorf("overwriting the input after %s changed the decoded value to %s, want %s; "+
				"copy what you decode, or implement kernel.AliasingCodec with AliasesInput true", d.op, codecShow(got), codecShow(s.Value))
		}
	}
}

// codecDistinctTypes keeps the first sample of each Go type.
func codecDistinctTypes(samples []CodecSample) []CodecSample {
	seen := make(map[reflect.Type]bool)
	var out []CodecSample
	for _, s := range samples {
		if rt := reflect.TypeOf(s.New()); !seen[rt] {
			seen[rt] = true
			out = append(out, s)
		}
	}
	return out
}

// codecOutcome is what a call did: returned err, or panicked with value.
type codecOutcome struct {
	err      error
	panicked bool
	value    any
}

func codecCatch(f func() error) (o codecOutcome) {
	defer func() {
		if p := recover(); p != nil {
			o = codecOutcome{panicked: true, value: p}
		}
	}()
	return codecOutcome{err: f()}
}

// codecHex shows b in hex for failure messages: whole if it is short enough
// to paste into a test, else its start.
func codecHex(b []byte) string {
	const max = 256
	if len(b) <= max {
		return fmt.Sprintf("%d bytes %q", len(b), hex.EncodeToString(b))
	}
	return fmt.Sprintf("%d bytes %q...", len(b), hex.EncodeToString(b[:max]))
}

// codecShow prints v for a failure message, cut short: samples may be large.
func codecShow(v any) string {
	const max = 200
	s := fmt.Sprintf("%+v", v)
	if len(s) <= max {
		return s
	}
	return fmt.Sprintf("%s... (%d more characters)", s[:max], len(s)-max)
}
