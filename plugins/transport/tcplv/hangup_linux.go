//go:build linux

package tcplv

import (
	"encoding/binary"
	"net"
	"syscall"
)

// hungUp reports whether the peer has closed nc's connection (a FIN or a
// reset received), from the socket's TCP state: a connection past
// ESTABLISHED will carry no more requests to a server, even with bytes the
// peer sent before its close still waiting to be read (a late answer, a
// GoAway), which a peek at the socket would take for a live peer.
func hungUp(nc net.Conn) bool {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	// Control, not Read: it takes no read lock, so a ReadFrame that starts
	// meanwhile neither waits for it nor holds it up.
	_ = rc.Control(func(fd uintptr) {
		// tcp_info's first byte is the state; the kernel copies as much of
		// the struct as asked for, and GetsockoptInt asks for 4 bytes.
		v, err := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO)
		if err != nil {
			return
		}
		var info [4]byte
		binary.NativeEndian.PutUint32(info[:], uint32(v))
		gone = info[0] != tcpEstablished
	})
	return gone
}

// tcpEstablished is Linux's TCP_ESTABLISHED, tcp_info's state of a
// connection both sides still hold open.
const tcpEstablished = 1
