package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

// shm-ring has no write queue: a frame written to a ring its client does
// not read waits up to wait_timeout (here a minute) for room. Shutdown's
// GoAways must not wait so on each connection in turn: its context still
// bounds the shutdown, however many clients stopped reading.
func TestShutdownIsNotHeldByShmRingClientsThatDoNotRead(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Name = "shm-ring"
	cfg.Transport.Options = map[string]any{"ring_size": "16KiB", "wait_timeout": "60s"}
	srv := startServer(t, cfg, nil)
	opts := shmring.DefaultOptions()
	opts.RingSize = 16 << 10
	tr, err := shmring.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// More answers than the ring holds, which the clients never read. Each
	// takes 1KiB of it (the payload encoded takes 768 bytes, behind 256 of
	// headers), so the ring fills to the last byte, and no GoAway fits.
	payload := make([]byte, 765)
	for range 3 {
		c, err := tr.Dial(context.Background(), srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() }) // ends the blocked writes, should the test fail
		for id := range uint64(20) {
			if err := c.WriteFrame(echoRequest(t, id+1, "Echo.Echo", payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(300 * time.Millisecond) // the answers fill the rings
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	down := make(chan error, 1)
	go func() { down <- srv.Shutdown(ctx) }()
	// The context's 500ms and closing the connections: far less than a
	// GoAway's wait_timeout, let alone two of them on each connection.
	err = receive(t, down, 15*time.Second, "Shutdown outlived its context by more than 14.5s: shm-ring clients that do not read held it")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Shutdown took %v; its context ended after 500ms", took)
	}
	if err == nil {
		t.Errorf("Shutdown returned nil; the calls it could not answer in time should make it say so")
	}
}
