package plugintest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// contextWrite holds a connection that implements kernel.ContextWriter to
// its contract: a write waiting on a peer that reads nothing ends when its
// context does, either refused alone with the context's code or handed on
// (nil). Once the peer reads again, it reads every frame written before,
// nothing of a refused frame (a handed-on one whole), and the frame
// written next, whole. The engine writes a call's request with the call's
// context, so that a deadline bounds the wait.
func (e *transportEnv) contextWrite(t tb) {
	p := e.pair(t)
	w, ok := p.client.(kernel.ContextWriter)
	if !ok {
		t.Skipf("the connection (%T) does not implement kernel.ContextWriter", p.client)
	}
	size := e.capped(64 << 10)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var written atomic.Int64
	result := make(chan error, 1)
	transportGo(t, func() {
		// 32MiB is more than any connection should buffer.
		for i := range (32<<20)/size + 1 {
			if err := w.WriteFrameContext(ctx, transportSample(p.client, 9, i, size)); err != nil {
				result <- err
				return
			}
			written.Add(1)
			if ctx.Err() != nil {
				result <- errHandedOn
				return
			}
		}
		result <- nil
	})
	transportAwaitStall(&written, e.patience) // the writer now waits on the peer
	cancel()
	timer := time.NewTimer(e.patience)
	defer timer.Stop()
	select {
	case err := <-result:
		switch {
		case err == nil:
			t.Skipf("WriteFrameContext never waited: the transport took 32MiB for a peer that reads nothing")
		case errors.Is(err, errHandedOn):
		case kernel.CodeOf(err) != kernel.Canceled:
			t.Fatalf("a WriteFrameContext waiting on a peer that reads nothing returned %v when its context was canceled; want nil (handed on) or a *kernel.Status with code Canceled", err)
		case p.client.Err() != nil:
			t.Fatalf("a WriteFrameContext whose context ended killed the connection (%v); it must refuse that frame alone", p.client.Err())
		}
	case <-timer.C:
		t.Fatalf("a WriteFrameContext waiting on a peer that reads nothing was still waiting %s after its context was canceled (%d frames of %d bytes written before)",
			e.patience, written.Load(), size)
	}

	// The frame after it is written while the peer reads again: the ring,
	// or whatever the transport waited on, is still full. A frame handed
	// on is among those written.
	n := int(written.Load())
	next := make(chan error, 1)
	transportGo(t, func() { next <- p.client.WriteFrame(transportSample(p.client, 10, 0, 100)) })
	for i := range n + 1 {
		want := transportSample(nil, 9, i, size)
		if i == n {
			want = transportSample(nil, 10, 0, 100)
		}
		got := e.recv(t, p.server)
		d := transportDiff(got, want)
		got.Release()
		if d != "" {
			t.Fatalf("frame %d of %d written, around one whose context ended, arrived changed: %s; "+
				"nothing of a refused frame may reach the peer, and a frame handed on must arrive whole", i+1, n+1, d)
		}
	}
	if err := <-next; err != nil {
		t.Fatalf("WriteFrame after a frame whose context ended: %v; the connection must stay usable", err)
	}
}

// errHandedOn says a WriteFrameContext returned nil once its context had
// ended: the frame is the transport's to deliver.
var errHandedOn = errors.New("handed on")
