package fbverify_test

import (
	"errors"
	"testing"

	fb "github.com/google/flatbuffers/go"

	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// A table whose vtable puts a 4-byte scalar field at the last inline byte
// passes Root (which checks only where each field starts), and a
// generated accessor for that field (GetUint32Slot is what flatc's code
// does) would read past the buffer's end. Scalar lets a Verifier refuse
// it; a 1-byte field there is fine.
func TestScalarRefusesAFieldWiderThanTheTableLeaves(t *testing.T) {
	buf := []byte{
		10, 0, 0, 0, // root offset: the table at 10
		6, 0, // vtable at 4: 6 bytes long
		5, 0, // the table has 5 inline bytes
		4, 0, // field 0 (slot 4) at offset 4: the table's last byte
		6, 0, 0, 0, // table at 10: its vtable is 6 bytes before it
		0, // field 0's first byte; the buffer ends here
	}
	pos, err := fbverify.Root(buf)
	if err != nil {
		t.Fatalf("Root refuses a buffer whose fields all start inside the table: %v", err)
	}
	tab := fb.Table{Bytes: buf, Pos: pos}
	if err := fbverify.Scalar(&tab, 4, 4); !errors.Is(err, fbverify.ErrMalformed) {
		t.Errorf("Scalar(slot 4, 4 bytes) = %v; want ErrMalformed, since reading it would run past the buffer", err)
	}
	if err := fbverify.Scalar(&tab, 4, 1); err != nil {
		t.Errorf("Scalar(slot 4, 1 byte) = %v; want nil", err)
	}
	if err := fbverify.Scalar(&tab, 6, 8); err != nil {
		t.Errorf("Scalar of an absent field = %v; want nil", err)
	}
	func() {
		defer func() { recover() }()
		_ = tab.GetUint32Slot(4, 0)
		t.Errorf("reading the 4-byte field did not panic; the buffer does not show the gap it is meant to")
	}()
}
