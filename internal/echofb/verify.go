package echofb

import (
	"fmt"

	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// Vtable slots of Echo's fields, as Echo.go reads them.
const (
	payloadSlot = 4
	textSlot    = 6
)

// VerifyFlatBuffer checks that Echo's reference fields lie inside its buffer,
// so that no accessor can read out of bounds. The flatbuffers codec calls it
// on every Echo it decodes, after checking the table itself.
func (rcv *Echo) VerifyFlatBuffer() error {
	if err := fbverify.Vector(&rcv._tab, payloadSlot, 1); err != nil {
		return fmt.Errorf("echofb.Echo payload: %w", err)
	}
	if err := fbverify.String(&rcv._tab, textSlot); err != nil {
		return fmt.Errorf("echofb.Echo text: %w", err)
	}
	return nil
}
