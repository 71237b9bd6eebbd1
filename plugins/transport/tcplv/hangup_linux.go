package tcplv

import (
	"encoding/binary"
	"syscall"
)

// peerClosed reports whether the peer has closed the connection on fd (a
// FIN or a reset received), from the socket's TCP state: a connection past
// ESTABLISHED will carry no more requests to a server, even with bytes the
// peer sent before its close still waiting to be read (a late answer, a
// GoAway), which a peek at the socket would take for a live peer.
func peerClosed(fd int) bool {
	// tcp_info's first byte is the state; the kernel copies as much of the
	// struct as asked for, and GetsockoptInt asks for 4 bytes.
	v, err := syscall.GetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_INFO)
	if err != nil {
		return false
	}
	var info [4]byte
	binary.NativeEndian.PutUint32(info[:], uint32(v))
	return info[0] != tcpEstablished
}

// tcpEstablished is Linux's TCP_ESTABLISHED, tcp_info's state of a
// connection both sides still hold open.
const tcpEstablished = 1
