//go:build !linux

package tcplv

import (
	"net"
	"syscall"
)

// rawSocket is Linux's alone (rawio_linux.go); elsewhere every connection
// goes through net.Conn.
type rawSocket struct{}

func newRawSocket(net.Conn) *rawSocket { return nil }

func (*rawSocket) read([]byte) (int, error) { panic("tcp-lv: no raw socket on this system") }

func (*rawSocket) writev([][]byte, []syscall.Iovec) ([]syscall.Iovec, error) {
	panic("tcp-lv: no raw socket on this system")
}
