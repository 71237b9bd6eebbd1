package plugintest

import (
	"hash/fnv"
	"math/rand/v2"

	"github.com/kernrpc/kernrpc/kernel"
)

// Malformed input: every prefix of an encoding and random mutations of
// it must give an error or a value, never a panic or a hang.

// codecTruncatedMax bounds how many prefixes of one encoding are tried: all
// of them for small encodings, the shortest and longest and an even spread
// for large ones.
const codecTruncatedMax = 512

func codecTruncated(t tb, c kernel.Codec, s CodecSample, lenient CodecLeniency) {
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	zero, hasZero := codecZeroEncoding(c, s)
	strict := !lenient.Prefixes && !lenient.AnyInput
	accepted := 0
	for _, n := range codecPrefixLengths(len(data)) {
		// A copy with no spare capacity: a decoder that reads past len
		// panics here instead of reading stale bytes.
		in := append([]byte(nil), data[:n]...)
		got := s.New()
		p := codecCatch(func() error { return c.Unmarshal(in, got) })
		if p.panicked {
			t.Fatalf("Unmarshal of the first %d of %d bytes of sample %q panicked: %v\ninput: %s\n"+
				"a codec must return an error for truncated input", n, len(data), s.Name, p.value, codecHex(in))
		}
		if p.err != nil || !strict || (hasZero && string(in) == string(zero)) {
			continue
		}
		if accepted++; accepted <= 3 {
			t.Errorf("Unmarshal of the first %d of %d bytes of sample %q returned no error (decoded %s)\ninput: %s\n"+
				"input cut short must be an error: a decoder that stops where the input ends hands the caller half a message; "+
				"if the format itself makes such a prefix a valid encoding (protobuf does at field boundaries), set CodecConfig.Lenient.Prefixes",
				n, len(data), s.Name, codecShow(got), codecHex(in))
		}
	}
	if accepted > 3 {
		t.Errorf("... and %d more prefixes of sample %q were accepted", accepted-3, s.Name)
	}
}

func codecPrefixLengths(size int) []int {
	if size <= codecTruncatedMax {
		out := make([]int, size)
		for i := range out {
			out[i] = i
		}
		return out
	}
	const edge = codecTruncatedMax / 4
	var out []int
	for i := range edge {
		out = append(out, i, size-1-i)
	}
	step := size / (codecTruncatedMax - 2*edge)
	for i := edge; i < size-edge; i += step {
		out = append(out, i)
	}
	return out
}

// codecRandomInputs is how many random and mutated inputs each sample gets.
const codecRandomInputs = 256

func codecRandom(t tb, c kernel.Codec, s CodecSample) {
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	// A seed derived from the sample's name: each sample gets its own
	// inputs, and a failure reproduces on the next run.
	h := fnv.New64a()
	h.Write([]byte(s.Name))
	seed := h.Sum64()
	rng := rand.New(rand.NewPCG(seed, 0x6b65726e727063))
	for i := range codecRandomInputs {
		var in []byte
		if i%2 == 0 {
			in = make([]byte, rng.IntN(256))
			for j := range in {
				in[j] = byte(rng.UintN(256))
			}
		} else {
			in = codecMutate(rng, data)
		}
		got := s.New()
		if p := codecCatch(func() error { return c.Unmarshal(in, got) }); p.panicked {
			t.Fatalf("Unmarshal of random input %d (seed %#x) into %T panicked: %v\ninput: %s\n"+
				"a codec must return an error for input it cannot decode", i, seed, got, p.value, codecHex(in))
		}
	}
}

// codecMutate returns a copy of data with a few bytes changed, inserted or
// removed: input close enough to valid to reach deep into a decoder.
func codecMutate(rng *rand.Rand, data []byte) []byte {
	out := append([]byte(nil), data...)
	for range 1 + rng.IntN(4) {
		switch op := rng.IntN(3); {
		case len(out) == 0 || op == 0:
			i := rng.IntN(len(out) + 1)
			out = append(out[:i], append([]byte{byte(rng.UintN(256))}, out[i:]...)...)
		case op == 1:
			out[rng.IntN(len(out))] ^= byte(1 + rng.UintN(255))
		default:
			i := rng.IntN(len(out))
			out = append(out[:i], out[i+1:]...)
		}
	}
	return out[:len(out):len(out)]
}
