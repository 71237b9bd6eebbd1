package fbverify_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	fb "github.com/google/flatbuffers/go"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// layout is where the parts of an encoded echofb.Echo are, found through the
// runtime on a valid buffer, so that each case below breaks exactly one.
type layout struct {
	buf                    []byte
	root, vtable           int
	payloadRef, payloadVec int // the field's offset slot, and the vector it points to
	textRef, textVec       int
}

func encode(text string, payload []byte) layout {
	b := fb.NewBuilder(0)
	p := b.CreateByteVector(payload)
	s := b.CreateString(text)
	echofb.EchoStart(b)
	echofb.EchoAddPayload(b, p)
	echofb.EchoAddText(b, s)
	b.Finish(echofb.EchoEnd(b))
	l := layout{buf: bytes.Clone(b.FinishedBytes())}
	t := fb.Table{Bytes: l.buf, Pos: fb.GetUOffsetT(l.buf)}
	l.root = int(t.Pos)
	l.vtable = l.root - int(fb.GetSOffsetT(l.buf[l.root:]))
	l.payloadRef = l.root + int(t.Offset(4))
	l.payloadVec = l.payloadRef + int(fb.GetUOffsetT(l.buf[l.payloadRef:]))
	l.textRef = l.root + int(t.Offset(6))
	l.textVec = l.textRef + int(fb.GetUOffsetT(l.buf[l.textRef:]))
	return l
}

func put32(b []byte, at int, v uint32) { binary.LittleEndian.PutUint32(b[at:], v) }
func put16(b []byte, at int, v uint16) { binary.LittleEndian.PutUint16(b[at:], v) }

func TestEveryBrokenPartIsFound(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(l layout)
		want    string // what the error must say
	}{
		{"root offset past the end", func(l layout) { put32(l.buf, 0, uint32(len(l.buf))) }, "runs past the end"},
		{"vtable before the buffer start", func(l layout) { put32(l.buf, l.root, uint32(l.root+1)) }, "would be at -1"},
		// The runtime computes the vtable in int32: a large negative soffset
		// wraps there and must not wrap here.
		{"vtable offset that wraps in int32", func(l layout) { put32(l.buf, l.root, 0x80000000) }, "would be at 2147483660"},
		{"odd vtable length", func(l layout) { put16(l.buf, l.vtable, 7) }, "claims 7 bytes"},
		{"vtable longer than the buffer", func(l layout) { put16(l.buf, l.vtable, 0xfffe) }, "claims 65534 bytes"},
		{"table longer than the buffer", func(l layout) { put16(l.buf, l.vtable+2, 0xfffe) }, "claims 65534 inline bytes"},
		{"field offset outside the table", func(l layout) { put16(l.buf, l.vtable+4, 0xfff0) }, "outside its 12 inline bytes"},
		{"payload vector past the end", func(l layout) { put32(l.buf, l.payloadRef, uint32(len(l.buf))) }, "points to"},
		{"payload length past the end", func(l layout) { put32(l.buf, l.payloadVec, 0xffffffff) }, "4294967295 bytes of elements"},
		{"text length past the end", func(l layout) { put32(l.buf, l.textVec, 1<<20) }, "1048576 bytes of elements"},
		{"text without its NUL", func(l layout) { l.buf[l.textVec+4+5] = 'x' }, "lacks its terminating NUL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := encode("hello", []byte("world!"))
			var e echofb.Echo
			if err := fbverify.InitRoot(&e, l.buf); err != nil {
				t.Fatalf("the valid buffer fails: %v", err)
			}
			tc.corrupt(l)
			err := fbverify.InitRoot(&e, l.buf)
			if !errors.Is(err, fbverify.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("InitRoot = %v, want an error wrapping ErrMalformed that says %q", err, tc.want)
			}
			if e.Table().Bytes != nil {
				t.Error("after a failed InitRoot the table still points at the buffer")
			}
		})
	}
}

func TestAbsentFieldsAreFine(t *testing.T) {
	b := fb.NewBuilder(0)
	echofb.EchoStart(b)
	b.Finish(echofb.EchoEnd(b))
	var e echofb.Echo
	if err := fbverify.InitRoot(&e, b.FinishedBytes()); err != nil {
		t.Fatalf("a table with no fields: %v", err)
	}
	if e.PayloadBytes() != nil || e.Text() != nil {
		t.Error("absent fields read as present")
	}
}

func TestRootRefusesTinyBuffers(t *testing.T) {
	for n := range 4 {
		if _, err := fbverify.Root(make([]byte, n)); !errors.Is(err, fbverify.ErrMalformed) {
			t.Errorf("%d bytes: err = %v, want ErrMalformed", n, err)
		}
	}
}
