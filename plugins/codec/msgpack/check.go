package msgpack

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by the error for input that check refuses before
// the library decodes it.
var ErrMalformed = errors.New("malformed MessagePack")

// maxDepth bounds how deeply arrays and maps may nest, as encoding/json
// bounds JSON: the library decodes (and skips unknown fields) recursively.
const maxDepth = 10000

// check walks data as one MessagePack value without decoding it and
// returns how many bytes that value takes. It refuses a string, binary or
// extension longer than the bytes left, an array or map claiming more
// elements than bytes left (each element takes at least one), and nesting
// deeper than maxDepth.
//
// The library trusts a claimed length: v5.4.1 sizes a slice by it before
// reading a single element (its allocation limit is never applied), so 13
// bytes claiming 2^31 floats made it allocate tens of gigabytes. After
// check, what it allocates is bounded by a small multiple of the input.
func check(data []byte) (int, error) {
	// left counts, per open array or map, the values still to read; the
	// first slot is the top-level value. Most messages nest a few levels,
	// which the array holds without allocating.
	var stack [16]int
	left := append(stack[:0], 1)
	p := 0
	for len(left) > 0 {
		top := len(left) - 1
		if left[top] == 0 {
			left = left[:top]
			continue
		}
		left[top]--
		if p >= len(data) {
			return p, fmt.Errorf("%w: input ends where a value should start (byte %d)", ErrMalformed, p)
		}
		c := data[p]
		p++
		size, elems, err := header(c, data[p:])
		if err != nil {
			return p, fmt.Errorf("%w: at byte %d: %v", ErrMalformed, p-1, err)
		}
		rest := len(data) - p
		switch {
		case size > rest:
			return p, fmt.Errorf("%w: value at byte %d claims %d bytes, but %d are left", ErrMalformed, p-1, size, rest)
		case elems > rest-size:
			return p, fmt.Errorf("%w: array or map at byte %d claims %d values, but %d bytes are left", ErrMalformed, p-1, elems, rest-size)
		}
		p += size
		if elems > 0 {
			if len(left) > maxDepth {
				return p, fmt.Errorf("%w: arrays and maps nested deeper than %d", ErrMalformed, maxDepth)
			}
			left = append(left, elems)
		}
	}
	return p, nil
}

// header reads the format byte c and what follows it in rest: size is how
// many bytes after c the value itself takes (its length field included),
// elems how many values an array or map holds (a map's keys and values
// both count).
func header(c byte, rest []byte) (size, elems int, err error) {
	switch {
	case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		return 0, 0, nil
	case c&0xf0 == 0x80: // fixmap
		return 0, 2 * int(c&0x0f), nil
	case c&0xf0 == 0x90: // fixarray
		return 0, int(c & 0x0f), nil
	case c&0xe0 == 0xa0: // fixstr
		return int(c & 0x1f), 0, nil
	}
	switch c {
	case 0xcc, 0xd0: // uint8, int8
		return 1, 0, nil
	case 0xcd, 0xd1: // uint16, int16
		return 2, 0, nil
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return 4, 0, nil
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return 8, 0, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type byte and data
		return 1 + 1<<(c-0xd4), 0, nil
	case 0xc4, 0xd9: // bin8, str8
		n, err := length(rest, 1)
		return 1 + n, 0, err
	case 0xc5, 0xda: // bin16, str16
		n, err := length(rest, 2)
		return 2 + n, 0, err
	case 0xc6, 0xdb: // bin32, str32
		n, err := length(rest, 4)
		return 4 + n, 0, err
	case 0xc7: // ext8: length, type byte, data
		n, err := length(rest, 1)
		return 2 + n, 0, err
	case 0xc8: // ext16
		n, err := length(rest, 2)
		return 3 + n, 0, err
	case 0xc9: // ext32
		n, err := length(rest, 4)
		return 5 + n, 0, err
	case 0xdc: // array16
		n, err := length(rest, 2)
		return 2, n, err
	case 0xdd: // array32
		n, err := length(rest, 4)
		return 4, n, err
	case 0xde: // map16
		n, err := length(rest, 2)
		return 2, 2 * n, err
	case 0xdf: // map32
		n, err := length(rest, 4)
		return 4, 2 * n, err
	}
	return 0, 0, fmt.Errorf("format byte 0x%02x is never used", c)
}

// length reads a big-endian length of width bytes from the start of b.
func length(b []byte, width int) (int, error) {
	if len(b) < width {
		return 0, fmt.Errorf("%d-byte length cut short", width)
	}
	switch width {
	case 1:
		return int(b[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(b)), nil
	}
	return int(binary.BigEndian.Uint32(b)), nil
}
