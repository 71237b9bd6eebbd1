package plugintest

import (
	"fmt"
	"iter"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kernrpc/kernrpc/kernel"
)

// codecLengths are the lengths the Lengths subtests give each variable-
// length field: empty, one, and both sides of every width a length is
// commonly encoded in: MessagePack's fixarray (15/16) and fixstr (31/32),
// one-byte lengths (255/256), varints of one, two and three bytes
// (127/128, 16383/16384, 2 MiB), two-byte lengths (65535/65536). The long
// run adds three-byte lengths (16 MiB) and four-byte varints (256 MiB).
func codecLengths(max int) []int {
	lengths := []int{0, 1, 15, 16, 31, 32, 127, 128, 255, 256, 1<<14 - 1, 1 << 14, 1<<16 - 1, 1 << 16, 1<<21 - 1, 1 << 21}
	if long() {
		lengths = append(lengths, 1<<24-1, 1<<24, 1<<28-1, 1<<28)
	}
	if max > 0 {
		for len(lengths) > 0 && lengths[len(lengths)-1] > max {
			lengths = lengths[:len(lengths)-1]
		}
	}
	return lengths
}

// codecMaxFields bounds how many fields of one sample the suite resizes.
const codecMaxFields = 4

// codecVariant is a copy of a sample with one field at one length.
type codecVariant struct {
	what  string // for messages: "field Payload at 128 bytes"
	value any
	data  []byte // its encoding, once Marshal made it
}

// codecMeasured is what Size makes of one Lengths value: its encoded
// length, and what a CodecSizer's Size said of it (-1: Size panicked).
type codecMeasured struct {
	what           string
	encoded, sized int
	panicked       any
}

// codecMeasurements keeps, by sample name, the Size of each value Lengths
// encoded, so that the Size subtest need not build megabytes again, and
// nothing holds them meanwhile.
type codecMeasurements struct {
	mu sync.Mutex
	m  map[string][]codecMeasured
}

func (e *codecMeasurements) put(sample string, ms []codecMeasured) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[string][]codecMeasured)
	}
	e.m[sample] = ms
}

func (e *codecMeasurements) get(sample string) ([]codecMeasured, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ms, ok := e.m[sample]
	return ms, ok
}

// codecMeasure measures v, whose encoding is data, with sz.
func codecMeasure(sz kernel.CodecSizer, v codecVariant, data []byte) codecMeasured {
	m := codecMeasured{what: v.what, encoded: len(data)}
	if p := codecCatch(func() error { m.sized = sz.Size(v.value); return nil }); p.panicked {
		m.sized, m.panicked = -1, p.value
	}
	return m
}

// codecLengthsProperty runs Lengths/<sample> and fails Lengths if no
// sample could be resized: a silent pass would check nothing.
func codecLengthsProperty(t tb, c kernel.Codec, samples []CodecSample, max int, measured *codecMeasurements) {
	t.Run("Lengths", func(t tb) {
		covered := 0
		for _, s := range codecLengthSamples(samples) {
			t.Run(s.Name, func(t tb) {
				variants, why := codecVariants(t, c, s, max)
				if variants == nil {
					t.Skipf("%s", why)
				}
				covered++
				failures := 0
				sz, sizer := c.(kernel.CodecSizer)
				var sizes []codecMeasured
				for v := range variants {
					if !codecRoundTripVariant(t, c, s, &v) {
						if failures++; failures == 3 {
							t.Fatalf("(stopping after %d failures)", failures)
						}
					}
					if sizer && v.data != nil {
						sizes = append(sizes, codecMeasure(sz, v, v.data))
					}
				}
				measured.put(s.Name, sizes)
			})
		}
		if covered == 0 && !t.Failed() {
			t.Errorf("no sample has a string or []byte field the suite can resize (exported, reached through structs and pointers, " +
				"carried by the codec), so no length was checked; give CodecSample.Sized for at least one sample")
		}
	})
}

// codecLengthSamples picks the samples whose lengths are checked: one of
// each Go type, the first that gives Sized or else the first. Lengths are
// a property of how the codec writes a type's fields, and every large
// value costs time, so other samples of the type are not resized.
func codecLengthSamples(samples []CodecSample) []CodecSample {
	var out []CodecSample
	at := make(map[reflect.Type]int)
	for _, s := range samples {
		rt := reflect.TypeOf(s.New())
		i, seen := at[rt]
		switch {
		case !seen:
			at[rt] = len(out)
			out = append(out, s)
		case s.Sized != nil && out[i].Sized == nil:
			out[i] = s
		}
	}
	return out
}

// codecResized reports whether the Lengths subtests resize s.
func codecResized(s CodecSample, samples []CodecSample) bool {
	for _, r := range codecLengthSamples(samples) {
		if r.Name == s.Name {
			return true
		}
	}
	return false
}

func codecRoundTripVariant(t tb, c kernel.Codec, s CodecSample, v *codecVariant) bool {
	t.Helper()
	var data []byte
	p := codecCatch(func() (err error) { data, err = c.Marshal(nil, v.value); return err })
	switch {
	case p.panicked:
		t.Errorf("Marshal of sample %q with %s panicked: %v", s.Name, v.what, p.value)
		return false
	case p.err != nil:
		t.Errorf("Marshal of sample %q with %s: %v; the codec must encode values of every length", s.Name, v.what, p.err)
		return false
	}
	v.data = data
	got := s.New()
	p = codecCatch(func() error { return c.Unmarshal(data, got) })
	switch {
	case p.panicked:
		t.Errorf("Unmarshal of sample %q with %s (%s) panicked: %v", s.Name, v.what, codecHex(data), p.value)
		return false
	case p.err != nil:
		t.Errorf("Unmarshal of sample %q with %s (%s): %v; the codec must decode its own encoding at every length", s.Name, v.what, codecHex(data), p.err)
		return false
	case !codecEqual(s, v.value, got):
		t.Errorf("sample %q with %s did not survive the round trip: encoded %s, decoded %s, want %s; "+
			"a length on the edge of an encoding width (a varint's byte count, a one- or two-byte length) is read or written wrong",
			s.Name, v.what, codecHex(data), codecShow(got), codecShow(v.value))
		return false
	}
	return true
}

// codecVariants returns the sample's copies at each length, from
// CodecSample.Sized or from the fields the suite finds; nil and the reason
// if it has neither.
func codecVariants(t tb, c kernel.Codec, s CodecSample, max int) (iter.Seq[codecVariant], string) {
	t.Helper()
	lengths := codecLengths(max)
	if s.Sized != nil {
		return func(yield func(codecVariant) bool) {
			for _, n := range lengths {
				if !yield(codecVariant{what: fmt.Sprintf("Sized(%d)", n), value: s.Sized(n)}) {
					return
				}
			}
		}, ""
	}
	fields := codecResizableFields(t, c, s)
	if len(fields) == 0 {
		return nil, fmt.Sprintf("sample %q has no string or []byte field the suite can set (exported, reached through structs and "+
			"pointers) that the codec carries; give CodecSample.Sized to have its lengths checked", s.Name)
	}
	return func(yield func(codecVariant) bool) {
		for _, f := range fields {
			for _, n := range lengths {
				v := codecCopy(t, c, s)
				f.set(v, n)
				if !yield(codecVariant{what: fmt.Sprintf("field %s at %d bytes", f.name, n), value: codecShaped(s, v)}) {
					return
				}
			}
		}
	}, ""
}

// codecField is a string or []byte field of a sample's type, by the
// indexes that lead to it from the struct New points to.
type codecField struct {
	name string
	path []int
}

// set sets the field in the value p (a pointer from New) to n bytes.
func (f codecField) set(p any, n int) {
	v := reflect.ValueOf(p).Elem()
	for _, i := range f.path {
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		v = v.Field(i)
	}
	if v.Kind() == reflect.String {
		v.SetString(codecText(n))
	} else {
		v.SetBytes(codecBytes(n))
	}
}

// codecResizableFields finds the sample's string and []byte fields that
// the codec carries: a field is tried with a short value first, and left
// out unless it survives a round trip (a field tagged "-" does not).
func codecResizableFields(t tb, c kernel.Codec, s CodecSample) []codecField {
	t.Helper()
	var candidates []codecField
	var walk func(v reflect.Value, name string, path []int, depth int)
	walk = func(v reflect.Value, name string, path []int, depth int) {
		switch {
		case v.Kind() == reflect.String || (v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8):
			if v.CanSet() {
				candidates = append(candidates, codecField{name, path})
			}
		case v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct && len(path) > 0:
			walk(v.Elem(), name, path, depth)
		case v.Kind() == reflect.Struct && depth < 3:
			for i := range v.NumField() {
				sf := v.Type().Field(i)
				if !sf.IsExported() {
					continue
				}
				child := sf.Name
				if name != "" {
					child = name + "." + sf.Name
				}
				walk(v.Field(i), child, append(append([]int(nil), path...), i), depth+1)
			}
		}
	}
	p := codecCopy(t, c, s)
	root := reflect.ValueOf(p)
	if root.Kind() != reflect.Pointer || root.IsNil() {
		return nil
	}
	walk(root.Elem(), "", nil, 0)
	if len(candidates) > 0 && candidates[0].path == nil {
		candidates[0].name = "(the value itself)"
	}
	var carried []codecField
	for _, f := range candidates {
		if len(carried) == codecMaxFields {
			break
		}
		v := codecCopy(t, c, s)
		f.set(v, 16)
		want := codecShaped(s, v)
		var data []byte
		if p := codecCatch(func() (err error) { data, err = c.Marshal(nil, want); return err }); p.panicked || p.err != nil {
			continue
		}
		got := s.New()
		if p := codecCatch(func() error { return c.Unmarshal(data, got) }); p.panicked || p.err != nil || !codecEqual(s, want, got) {
			continue
		}
		carried = append(carried, f)
	}
	return carried
}

// codecCopy returns a copy of the sample's value, decoded into a pointer
// from New by the codec itself (the suite cannot copy unexported state).
func codecCopy(t tb, c kernel.Codec, s CodecSample) any {
	t.Helper()
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	got, ok := codecDecode(t, c, s, data)
	if !ok {
		t.Fatalf("the suite copies sample %q by decoding its encoding, which failed", s.Name)
	}
	if !codecEqual(s, s.Value, got) {
		t.Fatalf("sample %q does not survive a round trip (see RoundTrip), so the suite cannot copy it", s.Name)
	}
	return got
}

// codecShaped returns p, a pointer from New, in the shape of s.Value:
// itself, or what it points to.
func codecShaped(s CodecSample, p any) any {
	if reflect.TypeOf(p) == reflect.TypeOf(s.Value) {
		return p
	}
	return reflect.ValueOf(p).Elem().Interface()
}

// codecBytes returns n bytes of every value in turn, a fresh copy each
// time (a codec may keep what it decodes), cut from one long run made
// once: filling megabytes byte by byte is slow under -race.
func codecBytes(n int) []byte {
	codecPatterns.once.Do(codecPatterns.make)
	if n > len(codecPatterns.bytes) {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + 1)
		}
		return b
	}
	return append([]byte(nil), codecPatterns.bytes[:n]...)
}

// codecText returns n bytes of valid UTF-8 with multi-byte characters in
// it, so that a length counted in characters instead of bytes shows.
func codecText(n int) string {
	codecPatterns.once.Do(codecPatterns.make)
	text := codecPatterns.text
	if n > len(text) {
		text = strings.Repeat(codecTextUnit, n/len(codecTextUnit)+1)
	}
	// Cut at a character boundary and pad with ASCII to exactly n bytes.
	cut := n
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + strings.Repeat("x", n-cut)
}

const codecTextUnit = "kernrpc ✓ Zoë 😀 "

// codecPatterns holds the runs codecBytes and codecText cut from, as long
// as the longest default length (the long run's make their own).
var codecPatterns struct {
	once  sync.Once
	bytes []byte
	text  string
	make  func()
}

func init() {
	codecPatterns.make = func() {
		const n = 1<<21 + 1
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + 1)
		}
		codecPatterns.bytes = b
		codecPatterns.text = strings.Repeat(codecTextUnit, n/len(codecTextUnit)+1)
	}
}
