package tcplv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/raceflag"
	"github.com/kernrpc/kernrpc/kernel"
)

// deadlineOnlyCtx is a context only its deadline ends, which says so as
// the engine's call contexts do (kernel.DeadlineOnly); its Err reads the
// clock.
type deadlineOnlyCtx struct {
	context.Context // WithDeadline's, for Done
	dl              time.Time
}

func (c *deadlineOnlyCtx) DeadlineOnly() (time.Time, bool) { return c.dl, true }

func (c *deadlineOnlyCtx) Err() error {
	if !time.Now().Before(c.dl) {
		return context.DeadlineExceeded
	}
	return nil
}

func deadlineOnly(t *testing.T, d time.Duration) *deadlineOnlyCtx {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	dl, _ := ctx.Deadline()
	return &deadlineOnlyCtx{ctx, dl}
}

// A read under a context only its deadline ends waits with the socket's
// read deadline: it ends with DeadlineExceeded on time, allocating
// nothing for the context, and leaves the connection usable, also for a
// later read without a deadline that outlives the one left on the socket.
func TestDeadlineOnlyContextReadsWithTheSocketDeadline(t *testing.T) {
	client, server := connPair(t, testOptions())
	start := time.Now()
	if _, err := server.ReadFrame(deadlineOnly(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadFrame past the deadline: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took < 50*time.Millisecond || took > 2*time.Second {
		t.Errorf("ReadFrame with a 50ms deadline returned after %v", took)
	}
	time.AfterFunc(20*time.Millisecond, func() { _ = client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 7}) })
	f, err := server.ReadFrame(context.Background())
	if err != nil || f.CallID != 7 {
		t.Fatalf("a read without a deadline after one with: %v %v", f, err)
	}
	f.Release()

	if raceflag.Enabled {
		return
	}
	if allocs := blockingReadAllocs(t, deadlineOnly(t, time.Minute)); allocs != 0 {
		t.Errorf("a blocking ReadFrame under a deadline-only context: %.1f allocations, want 0", allocs)
	}
}

// A deadline-only context is not asked for Err before the read: one
// already past its deadline fails the read at once on the socket
// deadline, also when a later deadline, an earlier read's, is left there.
func TestDeadlineOnlyContextPastItsDeadlineFailsAtOnce(t *testing.T) {
	client, server := connPair(t, testOptions())
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameCancel, CallID: 9}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(deadlineOnly(t, time.Minute)) // leaves its deadline on the socket
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	start := time.Now()
	if _, err := server.ReadFrame(deadlineOnly(t, -time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadFrame under a deadline already past: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("ReadFrame under a deadline already past returned after %v", took)
	}
}
