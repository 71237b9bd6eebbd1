//go:build linux

package shmring

import (
	"runtime"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// TestAPollerHoldingEveryPLetsTheProcessRun gives the process one P. A
// reader polling for a frame holds it, and the goroutine that will write
// that frame must still run while the reader polls: without that, it runs
// only once the poll has ended in a nap (the whole spin budget later).
func TestAPollerHoldingEveryPLetsTheProcessRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	o := testOptions()
	o.Spin = kernel.Duration(maxSpin)
	r := newRawConn(t, newTransport(t, o))
	defer r.close()
	in := r.seg.ring(clientToServer)
	var pos uint64
	for round := range 20 {
		read := make(chan error, 1)
		go func() {
			f, err := r.c.ReadFrame(timeout(t, 20*time.Second))
			if err == nil {
				f.Release()
			}
			read <- err
		}()
		// With one P, this goroutine runs again while the reader polls only
		// if the poller lets it.
		for polling.Load() == 0 {
			if in.reader.Load() != awake {
				t.Fatalf("round %d: the reader stopped polling (sleep word %d) before any other goroutine of its process ran",
					round, in.reader.Load())
			}
			runtime.Gosched()
		}
		rec := rawRecord(kindFrame, encodeFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: uint64(round + 1)}))
		copy(in.data[pos:], rec)
		pos += uint64(len(rec))
		in.head.Store(pos)
		if err := <-read; err != nil {
			t.Fatalf("round %d: ReadFrame: %v", round, err)
		}
	}
}
