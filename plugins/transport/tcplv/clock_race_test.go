package tcplv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// The reader claims an accepted connection's first frame (stopFrameClock
// reports true: the frame is served) as first_frame_timeout runs out.
// Whichever claims first decides; the reader did, so the connection must
// not then be cut off by the very clock that lost the claim
// (TestAFirstFrameTheClockClaimedIsNotServed is the other way round). The
// window is nanoseconds wide: the two run at once, the reader a varying
// spin later, until one run lands in it (tens of thousands of runs before
// the fix) or 200,000 have not.
func TestAFirstFrameTheReaderClaimedIsNotCutOffByItsClock(t *testing.T) {
	o := testOptions()
	tr := newTransport(t, o)
	bad := 0
	var spin int
	for i := 0; i < 200000 && bad == 0; i++ {
		local, peer := net.Pipe()
		go io.Copy(io.Discard, peer)
		c := newConn(tr, local, local, true)
		c.frameTimer.Stop()
		c.clockDeadline.Store(time.Now().Add(-time.Millisecond).UnixNano())
		c.reading.Store(true) // the reader is inside ReadFrame
		var served bool
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; c.frameExpired() })
		wg.Go(func() {
			<-start
			for k := 0; k < i%64; k++ {
				spin++
			}
			served = c.stopFrameClock()
		})
		close(start)
		wg.Wait()
		if err := c.Err(); served && err != nil {
			bad++
			t.Errorf("iteration %d: the reader claimed the first frame (it is served), then the clock killed the connection: %v", i, err)
		}
		c.reading.Store(false)
		c.Close()
		peer.Close()
	}
}
