package plugintest

import (
	"bytes"
	"fmt"

	"github.com/kernrpc/kernrpc/kernel"
)

// codecJunk are trailers that continue no encoding of any format the
// suite knows: a lone 0x00 (protobuf field 0, a JSON control character),
// 0xff (an unfinished varint, MessagePack's -1 after a complete value) and
// eleven 0xff (a varint longer than any).
var codecJunk = [][]byte{{0x00}, {0xff}, bytes.Repeat([]byte{0xff}, 11)}

// codecGarbageInputs are inputs no format encodes a message as. An empty
// input is not among them: it is protobuf's encoding of the empty message.
var codecGarbageInputs = [][]byte{
	{0x00},
	bytes.Repeat([]byte{0x00}, 16),
	bytes.Repeat([]byte{0xff}, 11),
	{0xc1}, // the one byte MessagePack never uses
}

func codecTrailing(t tb, c kernel.Codec, s CodecSample, lenient CodecLeniency) {
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	t.Run("Junk", func(t tb) {
		if lenient.TrailingBytes || lenient.AnyInput {
			t.Skipf("CodecConfig.Lenient declares TrailingBytes: the format ignores what follows an encoding")
		}
		for _, junk := range codecJunk {
			codecRefuses(t, c, s, append(append([]byte(nil), data...), junk...),
				fmt.Sprintf("sample %q followed by %x", s.Name, junk),
				"bytes after a complete encoding must be an error: a decoder that stops after the value hides whatever "+
					"the peer meant by the rest (with encoding/json, check that Decoder.More is false, or use json.Unmarshal)",
				"TrailingBytes")
		}
	})
	t.Run("Repeated", func(t tb) {
		if lenient.Concatenation || lenient.TrailingBytes || lenient.AnyInput {
			t.Skipf("CodecConfig.Lenient declares Concatenation or TrailingBytes: two encodings in a row are valid in the format")
		}
		codecRefuses(t, c, s, append(append([]byte(nil), data...), data...),
			fmt.Sprintf("sample %q twice over", s.Name),
			"two values in one message must be an error: the codec would keep one and drop the other",
			"Concatenation")
	})
}

func codecGarbage(t tb, c kernel.Codec, types []CodecSample, lenient CodecLeniency) {
	if lenient.AnyInput {
		t.Skipf("CodecConfig.Lenient declares AnyInput: every input is valid in the format")
	}
	for _, s := range types {
		zero, hasZero := codecZeroEncoding(c, s)
		for _, in := range codecGarbageInputs {
			if hasZero && bytes.Equal(in, zero) {
				continue // the codec's own encoding of an empty message
			}
			codecRefuses(t, c, s, append([]byte(nil), in...), fmt.Sprintf("garbage into %T", s.New()),
				"input that encodes nothing must be an error, not an empty or partial message", "AnyInput")
		}
	}
}

// codecRefuses fails t unless Unmarshal of in returns an error without
// panicking. what names the input, why says why it must fail, and
// lenient is the CodecLeniency field that would declare it valid.
func codecRefuses(t tb, c kernel.Codec, s CodecSample, in []byte, what, why, lenient string) {
	t.Helper()
	got := s.New()
	switch p := codecCatch(func() error { return c.Unmarshal(in, got) }); {
	case p.panicked:
		t.Errorf("Unmarshal of %s panicked: %v\ninput: %s", what, p.value, codecHex(in))
	case p.err == nil:
		t.Errorf("Unmarshal of %s returned no error (decoded %s)\ninput: %s\n%s; if the format itself makes this input valid, "+
			"set CodecConfig.Lenient.%s", what, codecShow(got), codecHex(in), why, lenient)
	}
}
