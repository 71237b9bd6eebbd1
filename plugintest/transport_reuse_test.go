package plugintest

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportKeepsFrame is a WriteFrame that keeps f, the caller's
// *kernel.Frame, and writes it when the next WriteFrame comes or, with
// none, a moment later (a cork that queues frames by pointer): by then
// the caller may have refilled f, as the engine does with a stream's one
// frame. The checks that write a fresh Frame each time pass it.
func transportKeepsFrame(c *transportFaultyConn, f *kernel.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := c.held
	c.held = []*kernel.Frame{f}
	time.AfterFunc(transportCorkDelay, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.held) == 1 && c.held[0] == f {
			c.held = nil
			_ = c.Conn.WriteFrame(f)
		}
	})
	for _, h := range held {
		if err := c.Conn.WriteFrame(h); err != nil {
			return err
		}
	}
	return nil
}

// transportCorkDelay is how long transportKeepsFrame keeps a frame no
// other write follows.
const transportCorkDelay = 100 * time.Millisecond

// TestTransportCatchesATransportKeepingTheFrame: a transport that keeps
// the *kernel.Frame it was given after WriteFrame returns, and reads its
// fields later, sends whatever the caller put in the Frame since.
// Frames/ReusedFrame writes from one Frame refilled after each write, as
// the engine does, and catches it; tcp-lv, which encodes (or copies) the
// frame before WriteFrame returns, passes.
func TestTransportCatchesATransportKeepingTheFrame(t *testing.T) {
	const path = "Transport/Frames/ReusedFrame"
	cfg := TransportConfig{Options: map[string]any{"max_frame_size": "64KiB"}, MaxFrameSize: 64 << 10, Patience: transportCasePatience}
	f := transportBroken(t, transportFaults{write: transportKeepsFrame})
	rec := record(t, "Transport", func(t tb) { transportSuite(transportFocus{t, []string{path}}, f, cfg) })
	expectCaught(t, rec, path)
	expectMessage(t, rec, path, "does not keep f")
	onlyUnder(t, rec, path)

	// The checks that write a fresh Frame each time pass it: they wait
	// the default patience, as its frames go out a moment late.
	cfg.Patience = 0
	rec = record(t, "Transport", func(t tb) {
		transportSuite(transportFocus{t, []string{"Transport/Frames/1KiB", "Transport/Frames/InOrder", "Transport/Concurrent"}}, f, cfg)
	})
	for _, fl := range rec.failures {
		t.Errorf("the frame-keeping transport failed %s, which writes a fresh Frame each time: %s", fl.path, fl.msg)
	}

	good := transportBroken(t, transportFaults{})
	rec = record(t, "Transport", func(t tb) { transportSuite(transportFocus{t, []string{path}}, good, cfg) })
	for _, fl := range rec.failures {
		t.Errorf("the suite failed tcp-lv in %s: %s", fl.path, fl.msg)
	}
	if len(rec.paths()) == 0 {
		t.Errorf("no subtest ran")
	}
}
