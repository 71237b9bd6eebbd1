package tcplv

import "syscall"

// peerClosed reports whether the peer's FIN or reset waits unread on fd,
// peeking without waiting or consuming: a byte waiting, or none, says the
// connection may still be used. (Linux reads the TCP state instead, which
// sees a close behind bytes still unread.)
func peerClosed(fd int) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return n == 0 && err == nil || err != nil && err != syscall.EAGAIN && err != syscall.EINTR
}
