package kernrpc_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// mibInUse is the heap's spans in use after a collection, in MiB.
func mibInUse() float64 { return float64(heapInUse()) / (1 << 20) }

// A burst of large calls leaves the transports' free lists full of large
// buffers. Once the burst is over they give them back: a server does not
// hold its busiest moment's memory through the quiet hours after it
// (internal/bufpool's trimming, about a second after the burst).
func TestABurstsBuffersAreGivenBackOnceIdle(t *testing.T) {
	skipIfGCTuned(t)
	cfg := testConfig(t)
	none := kernel.Size(0)
	cfg.GCHeadroom = &none // the headroom is held on purpose, and would blur the figures
	// tcp-lv's default keepalive: testConfig's 200 ms timed out under the
	// burst when every package's tests ran at once with -race.
	cfg.Transport.Options = nil
	startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	before := mibInUse()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 2 {
				req := &echopb.Echo{Payload: bytes.Repeat([]byte{3}, 512<<10)}
				var resp echopb.Echo
				if err := cli.Call(context.Background(), "Echo.Echo", req, &resp); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	burst := mibInUse()
	// Without trimming the free lists keep some 25-35 MiB of the burst's
	// buffers for good. The burst itself is not held to a figure: a slow
	// one (-race, a loaded machine) may see trims while it runs.
	const kept = 10.0 // MiB over the heap before the burst
	idle := burst
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && idle-before > kept; {
		time.Sleep(100 * time.Millisecond)
		idle = mibInUse()
	}
	if idle-before > kept {
		t.Fatalf("%.1f MiB in use 15s after the burst, %.1f at its end, %.1f before it; want no more than %.0f MiB over before: the free lists must give back what the burst left", idle, burst, before, kept)
	}
	t.Logf("in use: %.1f MiB before the burst, %.1f at its end, %.1f once idle", before, burst, idle)
}
