package tcplv

import (
	"net"
	"syscall"
)

// hungUp reports whether the peer's FIN or reset waits unread on nc's
// socket, peeking without waiting or consuming: a byte waiting, or none,
// says the connection may still be used. (Linux reads the TCP state
// instead, which sees a close behind bytes still unread.)
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
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = n == 0 && err == nil || err != nil && err != syscall.EAGAIN && err != syscall.EINTR
	})
	return gone
}
