//go:build linux || darwin

package tcplv

import "net"

// hungUp reports whether the peer has closed nc's connection, as
// peerClosed reads it from the socket.
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
	_ = rc.Control(func(fd uintptr) { gone = peerClosed(int(fd)) })
	return gone
}
