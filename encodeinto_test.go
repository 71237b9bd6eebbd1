package kernrpc

import (
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// lendingConn is a Conn whose Buffer lends a fixed capacity and which
// records what comes back through Recycle.
type lendingConn struct {
	kernel.Conn
	lent     int
	recycled [][]byte
}

func (c *lendingConn) Buffer(int) []byte  { return make([]byte, 0, c.lent) }
func (c *lendingConn) Recycle(buf []byte) { c.recycled = append(c.recycled, buf) }

// appendCodec appends its value's bytes.
type appendCodec struct{}

func (appendCodec) Name() string { return "append" }
func (appendCodec) Marshal(dst []byte, v any) ([]byte, error) {
	return append(dst, v.([]byte)...), nil
}
func (appendCodec) Unmarshal([]byte, any) error { return nil }

// A transport that lends ring space must get back a buffer the encoding
// outgrew: it cannot tell on its own that the buffer was abandoned.
func TestEncodeIntoGivesBackAnOutgrownBuffer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lent     int
		value    []byte
		recycled bool
	}{
		{"fits", 16, make([]byte, 10), false},
		{"fits exactly", 16, make([]byte, 16), false},
		{"outgrows", 16, make([]byte, 17), true},
		{"no capacity lent", 0, make([]byte, 5), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &lendingConn{lent: tc.lent}
			payload, err := encodeInto(c, appendCodec{}, tc.value)
			if err != nil || len(payload) != len(tc.value) {
				t.Fatalf("encodeInto: %d bytes, %v", len(payload), err)
			}
			if got := len(c.recycled) == 1; got != tc.recycled {
				t.Fatalf("lent buffer recycled: %t, want %t", got, tc.recycled)
			}
			if tc.recycled && cap(c.recycled[0]) != tc.lent {
				t.Fatalf("recycled a buffer of capacity %d, not the one lent (%d)", cap(c.recycled[0]), tc.lent)
			}
		})
	}
}
