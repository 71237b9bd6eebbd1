// Package fbverify checks that a FlatBuffer received from a peer can be read
// without going out of bounds, before anything reads it.
//
// The FlatBuffers Go runtime reads fields by following offsets stored in the
// buffer and does no checking of its own: an offset that points past the end
// makes an accessor panic. The flatbuffers codec therefore checks the root
// table of every buffer it decodes (Root), and a generated table type
// declares its reference fields (vectors, strings) and its scalar fields
// wider than a byte to the codec by implementing a VerifyFlatBuffer method
// built from Vector, String and Scalar; see
// internal/echofb/verify.go for one.
//
// This package registers nothing; generated code may import it freely.
package fbverify

import (
	"errors"
	"fmt"

	fb "github.com/google/flatbuffers/go"
)

// ErrMalformed is wrapped by every error of this package.
var ErrMalformed = errors.New("malformed flatbuffer")

// MaxSize is the largest buffer FlatBuffers can address: offsets are 32-bit
// and the Go runtime keeps positions below 1<<31.
const MaxSize = 1<<31 - 1

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Initer is what flatc generates for every table type: Init points the
// table at position i of buf.
type Initer interface {
	Init(buf []byte, i fb.UOffsetT)
}

// Verifier is implemented by a table type that checks its own reference
// fields (vectors, strings, sub-tables) with Vector and String, once Init
// has pointed it at a table that passed Table, and its scalar fields wider
// than a byte with Scalar. A type whose fields are all byte-sized scalars
// needs none.
type Verifier interface {
	VerifyFlatBuffer() error
}

// InitRoot checks buf's root table, points t at it and, if t is a Verifier,
// lets it check its fields. On error t is pointed at an empty buffer, so
// that nothing reads what failed the checks.
func InitRoot(t Initer, buf []byte) error {
	pos, err := Root(buf)
	if err == nil {
		t.Init(buf, pos)
		if v, ok := t.(Verifier); ok {
			err = v.VerifyFlatBuffer()
		}
	}
	if err != nil {
		t.Init(nil, 0)
	}
	return err
}

// Root checks the root offset of buf, a finished FlatBuffer, and the table
// it points to (see Table), and returns the root table's position: what a
// generated type's Init takes.
func Root(buf []byte) (fb.UOffsetT, error) {
	if len(buf) < fb.SizeUOffsetT {
		return 0, malformed("%d bytes is too short to hold the root offset (4 bytes)", len(buf))
	}
	if len(buf) > MaxSize {
		return 0, malformed("%d bytes is more than a flatbuffer can address (%d)", len(buf), MaxSize)
	}
	pos := fb.GetUOffsetT(buf)
	if err := Table(buf, pos); err != nil {
		return 0, fmt.Errorf("root table: %w", err)
	}
	return pos, nil
}

// Table checks the table at pos in buf: the table's start, its vtable and
// the inline part of the table the vtable declares all lie inside buf, and
// every field the vtable lists starts inside that inline part. Reading the
// vtable, and any byte-sized scalar field, is then in bounds; wider scalar
// fields need Scalar, reference fields Vector or String.
func Table(buf []byte, pos fb.UOffsetT) error {
	n, p := int64(len(buf)), int64(pos)
	if p+fb.SizeSOffsetT > n {
		return malformed("table at %d runs past the end of the %d-byte buffer", p, n)
	}
	// Computed in int64: the runtime's int32 arithmetic would wrap a hostile
	// offset around to somewhere that looks valid.
	vt := p - int64(fb.GetSOffsetT(buf[p:]))
	if vt < 0 || vt+2*fb.SizeVOffsetT > n {
		return malformed("vtable of the table at %d would be at %d, outside the %d-byte buffer", p, vt, n)
	}
	vtLen := int64(fb.GetVOffsetT(buf[vt:]))
	tableLen := int64(fb.GetVOffsetT(buf[vt+fb.SizeVOffsetT:]))
	switch {
	case vtLen < 2*fb.SizeVOffsetT || vtLen%fb.SizeVOffsetT != 0 || vt+vtLen > n:
		return malformed("vtable at %d claims %d bytes; want an even count of at least 4 inside the %d-byte buffer", vt, vtLen, n)
	case tableLen < fb.SizeSOffsetT || p+tableLen > n:
		return malformed("table at %d claims %d inline bytes; want at least 4 inside the %d-byte buffer", p, tableLen, n)
	}
	for i := int64(2 * fb.SizeVOffsetT); i < vtLen; i += fb.SizeVOffsetT {
		if off := int64(fb.GetVOffsetT(buf[vt+i:])); off != 0 && (off < fb.SizeSOffsetT || off >= tableLen) {
			return malformed("field %d of the table at %d is at offset %d, outside its %d inline bytes", (i-4)/2, p, off, tableLen)
		}
	}
	return nil
}

// Scalar checks the scalar field of size bytes (4 for an int32, 8 for a
// float64) in vtable slot slot of t, a table that passed Table: when
// present, it lies inside t's inline part. Table checks only where each
// field starts, so a field wider than a byte needs Scalar: a vtable may
// start a 4-byte field at the table's last byte, the buffer's last too.
// An absent field is fine.
func Scalar(t *fb.Table, slot fb.VOffsetT, size int) error {
	off := int64(t.Offset(slot))
	if off == 0 {
		return nil
	}
	p := int64(t.Pos)
	vt := p - int64(fb.GetSOffsetT(t.Bytes[p:]))
	if end := off + int64(size); end > int64(fb.GetVOffsetT(t.Bytes[vt+fb.SizeVOffsetT:])) || p+end > int64(len(t.Bytes)) {
		return malformed("%d-byte field in slot %d of the table at %d runs past the table's inline bytes", size, slot, t.Pos)
	}
	return nil
}

// Vector checks the vector field in vtable slot slot (4 for the first field,
// 6 for the second, as generated code numbers them) of t, a table that
// passed Table: when present, its offset, its length and its elemSize-byte
// elements lie inside t's buffer. An absent field is fine.
func Vector(t *fb.Table, slot fb.VOffsetT, elemSize int) error {
	_, _, err := vector(t, slot, elemSize)
	return err
}

// String checks the string field in slot of t as Vector does, and that the
// string ends with the NUL byte FlatBuffers puts after every string.
func String(t *fb.Table, slot fb.VOffsetT) error {
	start, length, err := vector(t, slot, 1)
	if err != nil || start < 0 {
		return err
	}
	if end := start + length; end >= int64(len(t.Bytes)) || t.Bytes[end] != 0 {
		return malformed("string field in slot %d of the table at %d lacks its terminating NUL", slot, t.Pos)
	}
	return nil
}

// vector returns where the vector's elements start and how many bytes they
// take; start is -1 when the field is absent.
func vector(t *fb.Table, slot fb.VOffsetT, elemSize int) (start, length int64, err error) {
	off := int64(t.Offset(slot))
	if off == 0 {
		return -1, 0, nil
	}
	n := int64(len(t.Bytes))
	ref := int64(t.Pos) + off
	if ref+fb.SizeUOffsetT > n {
		return 0, 0, malformed("field in slot %d of the table at %d: its offset runs past the end of the %d-byte buffer", slot, t.Pos, n)
	}
	vec := ref + int64(fb.GetUOffsetT(t.Bytes[ref:]))
	if vec+fb.SizeUOffsetT > n {
		return 0, 0, malformed("field in slot %d of the table at %d points to %d, outside the %d-byte buffer", slot, t.Pos, vec, n)
	}
	length = int64(fb.GetUOffsetT(t.Bytes[vec:])) * int64(elemSize)
	start = vec + fb.SizeUOffsetT
	if start+length > n {
		return 0, 0, malformed("field in slot %d of the table at %d: %d bytes of elements from %d run past the end of the %d-byte buffer", slot, t.Pos, length, start, n)
	}
	return start, length, nil
}
