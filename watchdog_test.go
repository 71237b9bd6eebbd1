package kernrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// An inline call that begins just as the watchdog lapses (it saw the
// watchdog still armed, so it did not arm it) must still be watched: else
// its connection stays unread while it runs, and its Cancel is never seen.
func TestInlineCallStartingAsTheWatchdogLapsesIsWatched(t *testing.T) {
	free := make(chan struct{})
	entered := make(chan struct{}, 1)
	ended := make(chan error, 1)
	srv := startServer(t, testConfig(t), func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Block", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			entered <- struct{}{}
			select {
			case <-ctx.Done():
				ended <- ctx.Err()
				return nil, ctx.Err()
			case <-free:
				ended <- nil
				return req, nil
			}
		})
	})
	var freeOnce sync.Once
	defer freeOnce.Do(func() { close(free) })
	c := rawConn(t, srv.Addr())

	lapsing, goOn := make(chan struct{}), make(chan struct{})
	var once sync.Once
	kernrpc.SetWatchLapseHook(func() {
		once.Do(func() {
			close(lapsing)
			<-goOn
		})
	})
	defer kernrpc.SetWatchLapseHook(nil)

	// A quick inline call arms the watchdog; two ticks later it lapses.
	if got := roundTripRaw(t, c, echoRequest(t, 1, "Echo.Echo", nil)); got.Code != kernel.OK {
		t.Fatalf("quick call: %v %s", got.Code, got.Message)
	}
	receive(t, lapsing, 2*time.Second, "the watchdog did not lapse")
	// As it lapses, a call begins inline (the watchdog still reads armed).
	if err := c.WriteFrame(echoRequest(t, 2, "Echo.Block", nil)); err != nil {
		t.Fatal(err)
	}
	receive(t, entered, 2*time.Second, "blocking call not served")
	close(goOn)

	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("handler ended without its Cancel")
		}
	case <-time.After(time.Second):
		freeOnce.Do(func() { close(free) })
		<-ended
		t.Fatal("the Cancel of an inline call was never read: nobody read the connection while it ran")
	}
}
