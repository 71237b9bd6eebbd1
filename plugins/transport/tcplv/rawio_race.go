//go:build linux && race

package tcplv

import "sync"

// ioOrder stands in, for the race detector, for what the kernel orders:
// bytes written to a socket before they are read from it. net's own reads
// and writes tell the detector so (internal/poll's ioSync); raw system
// calls do not, and without this a test that hands a value over a
// connection is reported as a race. It exists in race-enabled builds
// alone.
var ioOrder sync.Mutex

// raceIOEdge is called before a raw write and after a raw read that
// brought data: each read then happens after every write before it.
func raceIOEdge() {
	ioOrder.Lock()
	//lint:ignore SA2001 the empty critical section is the point: the edge
	ioOrder.Unlock()
}
