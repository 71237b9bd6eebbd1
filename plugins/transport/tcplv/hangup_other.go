//go:build !linux && !darwin

package tcplv

import "net"

// hungUp cannot peek here: a call written on a connection its peer has
// closed fails with the connection, as on any transport.
func hungUp(net.Conn) bool { return false }
