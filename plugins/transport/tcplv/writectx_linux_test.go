package tcplv

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Writes with a context (ctxConn) on a raw socket: what a write whose
// context ended hands on.

// A direct write whose context ends while the peer drains nothing returns
// then, before write_timeout: what is left of its frame goes on a
// goroutine of the connection, frames written later queue behind it, and
// write_timeout still ends a peer that never drains.
func TestAWriteWhoseContextEndsIsHandedOnAndWriteTimeoutStillHolds(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 8 << 20
	o.MaxWriteQueue = 1 << 30 // the write timeout, not the queue, must end it
	o.WriteTimeout = kernel.Duration(time.Second)
	raw, server := rawPair(t, o)
	_ = raw // never read
	w := ctxConn{server}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	payload := make([]byte, 4<<20)
	// Loopback sockets buffer some MiB; 64 MiB fill them whatever the
	// host's settings.
	frame := func() *kernel.Frame {
		return &kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: append(server.Buffer(len(payload)), payload...)}
	}
	var err error
	sent := 0
	for ; sent < 64<<20 && err == nil && ctx.Err() == nil; sent += len(payload) {
		err = w.WriteFrameContext(ctx, frame())
	}
	if err != nil || ctx.Err() == nil {
		t.Fatalf("writes to a peer that reads nothing: %v (context ended: %v); want the one waiting when the context ended to return nil", err, ctx.Err() != nil)
	}
	if dead := server.Err(); dead != nil {
		t.Fatalf("the write whose context ended returned only once the connection had died (%v): it waited for write_timeout", dead)
	}
	for ; sent < 64<<20 && err == nil; sent += len(payload) {
		err = server.WriteFrame(frame())
	}
	wantDeath(t, readUntilDead(t, server, 10*time.Second), kernel.ErrPeerGone, "did not drain its socket for 1s")
}

// What is left of a frame whose context ended goes out under the deadline
// its write had: a peer that drains nothing still kills the connection
// within 1.5 × write_timeout of the write that found no room, as
// write_timeout promises, not 1.5 × write_timeout after the context
// ended.
func TestAHandedOnRestKeepsItsWritesDeadline(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 8 << 20
	o.MaxWriteQueue = 1 << 30 // the write timeout, not the queue, must end it
	o.WriteTimeout = kernel.Duration(2 * time.Second)
	raw, server := rawPair(t, o)
	_ = raw // never read
	stopDraining(t, raw, server)
	w := ctxConn{server}
	start := time.Now()
	// The context ends just before the first write's deadline (1.5 ×
	// write_timeout after it started): with the rest's write given a
	// deadline of its own, the connection would live on for another
	// 1.5 × write_timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2800*time.Millisecond)
	defer cancel()
	payload := make([]byte, 1<<20)
	var err error
	for sent := 0; sent < 64<<20 && err == nil && ctx.Err() == nil; sent += len(payload) {
		err = w.WriteFrameContext(ctx, &kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: append(server.Buffer(len(payload)), payload...)})
	}
	if err != nil || ctx.Err() == nil {
		t.Fatalf("writes to a peer that reads nothing: %v (context ended: %v); want the one waiting when the context ended to return nil", err, ctx.Err() != nil)
	}
	wantDeath(t, readUntilDead(t, server, 10*time.Second), kernel.ErrPeerGone, "did not drain its socket for 2s")
	// 3 s (1.5 × write_timeout) after the first write, with room to spare
	// for a slow machine; a rest given a deadline of its own dies at 5.8 s.
	if took := time.Since(start); took > 4500*time.Millisecond {
		t.Fatalf("a peer that drained nothing killed the connection %s after the first write; write_timeout 2s allows at most 3s", took.Round(time.Millisecond))
	}
}

// A connection that dies (of its reader's error, say) and is closed just
// as a write's context ends leaves nothing running once Close has
// returned: the rest of that write is not handed to a goroutine Close no
// longer waits for.
func TestAWriteHandedOnAsItsConnectionDiesLeavesNothingRunningPastClose(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 8 << 20
	o.MaxWriteQueue = 1 << 30
	raw, server := rawPair(t, o)
	stopDraining(t, raw, server)
	cut := server.sock.cut
	closed := make(chan struct{})
	server.sock.cut = func(d time.Time) error {
		err := cut(d)
		// Let the write see the cut, then have its connection die and be
		// closed before the write goes on.
		time.Sleep(100 * time.Millisecond)
		server.fail(slog.LevelDebug, errors.New("tcp-lv: test: the reader failed"))
		server.Close()
		close(closed)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	payload := make([]byte, 1<<20)
	var err error
	for sent := 0; sent < 64<<20 && err == nil && ctx.Err() == nil; sent += len(payload) {
		err = ctxConn{server}.WriteFrameContext(ctx, &kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: append(server.Buffer(len(payload)), payload...)})
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the write's context ended without cutting its deadline")
	}
	// Close has returned: whatever the connection's goroutines did
	// happened before (the race detector tells otherwise).
	if writes := server.writes; writes == 0 {
		t.Fatal("no write made")
	}
	if server.wmu.TryLock() {
		server.wmu.Unlock()
	} else {
		t.Fatal("the write side is still held after the connection was closed and the write returned")
	}
}

// stopDraining makes the socket buffers between raw and c small and fixed:
// Linux otherwise grows them, and lets a loopback peer that reads nothing
// take in some MiB a second more for a while.
func stopDraining(t *testing.T, raw net.Conn, c *conn) {
	t.Helper()
	if err := raw.(*net.TCPConn).SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	if err := c.raw.(*net.TCPConn).SetWriteBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
}
