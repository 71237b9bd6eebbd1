package plugintest

import (
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
// panicking, on every prefix of its encoding that Unmarshal refuses.
func codecFresh(t tb, c kernel.Codec, s CodecSample) {
	fu, ok := c.(kernel.FreshUnmarshaler)
	if !ok {
		t.Skipf("%T does not implement kernel.FreshUnmarshaler", c)
	}
	codecRoundTripWith(t, c, "UnmarshalFresh", fu.UnmarshalFresh, s)
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	for _, n := range codecPrefixLengths(len(data)) {
		in := data[:n:n] // no spare capacity: reading past len panics, as in Truncated
		want := codecCatch(func() error { return c.Unmarshal(in, s.New()) })
		got := codecCatch(func() error { return fu.UnmarshalFresh(in, s.New()) })
		switch {
		case got.panicked:
			t.Fatalf("UnmarshalFresh of the first %d of %d bytes panicked: %v; input %s", n, len(data), got.value, codecHex(in))
		case want.err != nil && got.err == nil:
			t.Fatalf("UnmarshalFresh accepted the first %d of %d bytes, which Unmarshal refuses (%v); input %s", n, len(data), want.err, codecHex(in))
		}
	}
}
