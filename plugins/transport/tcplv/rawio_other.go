//go:build !linux

package tcplv

import (
	"context"
	"net"
)

// rawSocket is Linux's alone (rawio_linux.go); elsewhere every connection
// goes through net.Conn.
type rawSocket struct {
	ctx   context.Context
	fired bool
	rest  []byte
}

func (*rawSocket) init(net.Conn) {}
func (*rawSocket) ok() bool      { return false }

func (*rawSocket) read([]byte) (int, error) { panic("tcp-lv: no raw socket on this system") }
func (*rawSocket) writev(...[]byte) error   { panic("tcp-lv: no raw socket on this system") }
