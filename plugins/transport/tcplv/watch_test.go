package tcplv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/raceflag"
	"github.com/kernrpc/kernrpc/kernel"
)

// blockingSender writes a frame on client for every receive on the
// returned channel, a little later, so that each read waits for its
// frame.
func blockingSender(t *testing.T, client *conn) chan<- struct{} {
	send := make(chan struct{})
	t.Cleanup(func() { close(send) })
	go func() {
		f := &kernel.Frame{Type: kernel.FrameCancel, CallID: 8}
		for range send {
			time.Sleep(100 * time.Microsecond)
			_ = client.WriteFrame(f)
		}
	}()
	return send
}

// blockingReadAllocs is the allocations of a ReadFrame under ctx that
// waits for its frame, on a fresh connection pair.
func blockingReadAllocs(t *testing.T, ctx context.Context) float64 {
	t.Helper()
	client, server := connPair(t, testOptions())
	send := blockingSender(t, client)
	return testing.AllocsPerRun(100, func() {
		send <- struct{}{}
		readOne(t, server, ctx)
	})
}

func readOne(t *testing.T, c *conn, ctx context.Context) {
	t.Helper()
	f, err := c.ReadFrame(ctx)
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	f.Release()
}

// A caller that reads again and again under one ctx that can be canceled
// is watched once: its blocking reads allocate nothing for the ctx.
func TestReusedContextIsWatchedOnce(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("the race detector allocates")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if allocs := blockingReadAllocs(t, ctx); allocs != 0 {
		t.Errorf("a blocking ReadFrame under a reused ctx: %.2f allocations, want 0", allocs)
	}
}

// The watch kept on a reused ctx still ends a read blocked under it, and
// its ctx canceled later does not fail a read under another one.
func TestKeptWatch(t *testing.T) {
	client, srv := connPair(t, testOptions())
	send := blockingSender(t, client)

	kept, cancelKept := context.WithCancel(context.Background())
	defer cancelKept()
	for range 3 {
		send <- struct{}{}
		readOne(t, srv, kept)
	}
	if srv.keptDone == nil {
		t.Fatal("no watch kept after three reads under one ctx")
	}
	time.AfterFunc(20*time.Millisecond, cancelKept)
	start := time.Now()
	if _, err := srv.ReadFrame(kept); !errors.Is(err, context.Canceled) {
		t.Fatalf("a read under the kept ctx, canceled while it blocks: %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the canceled read returned after %v", took)
	}

	// A new kept watch, whose ctx is canceled while a read under another
	// one blocks: that read goes on and gets its frame.
	again, cancelAgain := context.WithCancel(context.Background())
	for range 2 {
		send <- struct{}{}
		readOne(t, srv, again)
	}
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()
	time.AfterFunc(10*time.Millisecond, cancelAgain)
	time.AfterFunc(50*time.Millisecond, func() { send <- struct{}{} })
	readOne(t, srv, other)
}

// A ctx met once is watched for its read alone: canceled afterwards, as
// a call's own ctx is when the call ends, it interrupts nothing.
func TestOneReadContextIsNotKept(t *testing.T) {
	client, srv := connPair(t, testOptions())
	send := blockingSender(t, client)
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		send <- struct{}{}
		readOne(t, srv, ctx)
		cancel()
	}
	if srv.keptDone != nil {
		t.Errorf("a watch was kept for contexts each used for one read")
	}
}

// Close ends a kept watch, so that the connection holds no ctx.
func TestCloseEndsTheKeptWatch(t *testing.T) {
	client, srv := connPair(t, testOptions())
	send := blockingSender(t, client)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		send <- struct{}{}
		readOne(t, srv, ctx)
	}
	if srv.keptStop == nil {
		t.Fatal("no watch kept after two reads under one ctx")
	}
	stop := srv.keptStop
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if stop() {
		t.Errorf("the kept watch was still registered after Close")
	}
	if srv.keptStop != nil || srv.keptDone != nil {
		t.Errorf("Close left the kept watch's fields set")
	}
}
