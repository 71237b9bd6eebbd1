package plugintest

import (
	"fmt"

	"github.com/kernrpc/kernrpc/kernel"
)

// codecSized checks a kernel.SizedMarshaler: given the size Size just
// took, MarshalSized appends what decodes to the sample; given a size the
// value does not have (it changed since Size, as a caller racing with its
// send can make it), it fails or still encodes the value, never appending
// a corrupt encoding.
func codecSized(t tb, c kernel.Codec, s CodecSample) {
	sm, ok := c.(kernel.SizedMarshaler)
	if !ok {
		t.Skipf("%T does not implement kernel.SizedMarshaler", c)
	}
	sz, ok := c.(kernel.CodecSizer)
	if !ok {
		t.Fatalf("%T implements kernel.SizedMarshaler but not kernel.CodecSizer, whose Size gives MarshalSized its size", c)
	}
	prefix := []byte("plugintest-prefix")
	size := sz.Size(s.Value)
	for _, tc := range []struct {
		name  string
		size  int
		exact bool
	}{{"Exact", size, true}, {"Smaller", size - 1, false}, {"Larger", size + 1, false}} {
		t.Run(tc.name, func(t tb) {
			if tc.size < 0 {
				t.Skipf("Size is %d", size)
			}
			dst := append(make([]byte, 0, len(prefix)+size+64), prefix...)
			var out []byte
			p := codecCatch(func() (err error) { out, err = sm.MarshalSized(dst, s.Value, tc.size); return err })
			switch {
			case p.panicked:
				t.Fatalf("MarshalSized(dst, %T, %d) panicked: %v", s.Value, tc.size, p.value)
			case p.err != nil && tc.exact:
				t.Fatalf("MarshalSized(dst, %T, %d), the size Size gave: %v", s.Value, tc.size, p.err)
			case p.err != nil:
				return // refused a size the value does not have: right
			case len(out) < len(prefix) || string(out[:len(prefix)]) != string(prefix):
				t.Fatalf("MarshalSized's result %s does not start with dst %q; it must append", codecHex(out), prefix)
			}
			if got, ok := codecDecodeWith(t, "Unmarshal", c.Unmarshal, s, out[len(prefix):]); ok && !codecEqual(s, s.Value, got) {
				t.Errorf("MarshalSized told size %d (Size says %d) appended %s, which decodes to %s, want %s; "+
					"encode the value as it is, or fail when its size is not the one given",
					tc.size, size, codecHex(out[len(prefix):]), codecShow(got), codecShow(s.Value))
			}
		})
	}
}

// codecFresh checks a kernel.FreshUnmarshaler: UnmarshalFresh into a
// value New has just made decodes every sample, and fails, without
// panicking, on every input derived from its encoding that Unmarshal
// refuses.
func codecFresh(t tb, c kernel.Codec, s CodecSample) {
	fu, ok := c.(kernel.FreshUnmarshaler)
	if !ok {
		t.Skipf("%T does not implement kernel.FreshUnmarshaler", c)
	}
	codecRoundTripWith(t, c, "UnmarshalFresh", fu.UnmarshalFresh, s)
	codecRefusesAsUnmarshal(t, c, s, "UnmarshalFresh", fu.UnmarshalFresh)
}

// codecInPlace checks a kernel.InPlaceUnmarshaler: UnmarshalInPlace
// decodes every sample, and, since the server decodes every request
// with it, fails without panicking on every input derived from its
// encoding that Unmarshal refuses.
func codecInPlace(t tb, c kernel.Codec, s CodecSample) {
	d, ok := c.(kernel.InPlaceUnmarshaler)
	if !ok {
		t.Skipf("%T does not implement kernel.InPlaceUnmarshaler", c)
	}
	codecRoundTripWith(t, c, "UnmarshalInPlace", d.UnmarshalInPlace, s)
	codecRefusesAsUnmarshal(t, c, s, "UnmarshalInPlace", d.UnmarshalInPlace)
}

// codecRefusesAsUnmarshal fails t if unmarshal, an optional decoder
// named op that stands in for Unmarshal, panics on, or accepts, an input
// that Unmarshal refuses: a prefix of the sample's encoding (no spare
// capacity, so that reading past len panics as in Truncated), the
// encoding followed by junk or by itself, or garbage. Unmarshal being
// right about them is for Truncated, Trailing and Garbage to check.
func codecRefusesAsUnmarshal(t tb, c kernel.Codec, s CodecSample, op string, unmarshal func([]byte, any) error) {
	t.Helper()
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	check := func(in []byte, what string) bool {
		want := codecCatch(func() error { return c.Unmarshal(in, s.New()) })
		got := codecCatch(func() error { return unmarshal(in, s.New()) })
		switch {
		case got.panicked:
			t.Errorf("%s of %s panicked: %v; input %s", op, what, got.value, codecHex(in))
		case want.err != nil && got.err == nil:
			t.Errorf("%s accepted %s, which Unmarshal refuses (%v); input %s; it must refuse what Unmarshal does", op, what, want.err, codecHex(in))
		default:
			return true
		}
		return false
	}
	for _, n := range codecPrefixLengths(len(data)) {
		if !check(data[:n:n], fmt.Sprintf("the first %d of %d bytes", n, len(data))) {
			return
		}
	}
	for _, junk := range codecJunk {
		in := append(append([]byte(nil), data...), junk...)
		if !check(in[:len(in):len(in)], fmt.Sprintf("sample %q followed by %x", s.Name, junk)) {
			return
		}
	}
	twice := append(append([]byte(nil), data...), data...)
	if !check(twice[:len(twice):len(twice)], fmt.Sprintf("sample %q twice over", s.Name)) {
		return
	}
	for _, in := range codecGarbageInputs {
		in = append([]byte(nil), in...)
		if !check(in[:len(in):len(in)], fmt.Sprintf("the garbage %x", in)) {
			return
		}
	}
}
