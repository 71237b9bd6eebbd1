package plugintest

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kernrpc/kernrpc/kernel"
)

// The optional Conn interfaces the engine takes where a transport offers
// them: the server answers a burst through kernel.FrameQueuer and drains
// through kernel.HalfCloser. A connection that claims one is held to its
// contract; one that does not skips the check, saying so.

// transportOptionalFrames is how many frames the QueueFrame and HalfClose
// checks send: small ones, which every transport buffers, so that no
// write waits for the peer to read.
const transportOptionalFrames = 24

// optionalSize is the payload size of the seq-th frame those checks send.
func optionalSize(seq int) int { return seq * 41 % 1000 }

func (e *transportEnv) queueFrame(t tb) {
	t.Run("Alone", e.queueAlone)
	t.Run("InOrder", e.queueInOrder)
}

// queuer returns c's QueueFrame, skipping t if it has none.
func queuer(t tb, c kernel.Conn) kernel.FrameQueuer {
	t.Helper()
	q, ok := c.(kernel.FrameQueuer)
	if !ok {
		t.Skipf("the connection (%T) does not implement kernel.FrameQueuer", c)
	}
	return q
}

// queueAlone queues one frame and writes nothing after it: the server
// queues the last answer of a burst so, and the client waits for it.
func (e *transportEnv) queueAlone(t tb) {
	p := e.pair(t)
	q := queuer(t, p.server)
	for _, size := range []int{0, 100, e.capped(70 << 10)} {
		want := transportSample(nil, 3, size, size)
		f := transportHeader(want)
		f.Payload = append(p.server.Buffer(size), want.Payload...)
		queued, ok := transportDo(t, e.patience, func() error { return q.QueueFrame(f) })
		switch {
		case !ok:
			t.Fatalf("QueueFrame of a %d-byte payload did not return within %s; it must add the frame to the next batch, never wait for the peer", size, e.patience)
		case queued != nil:
			t.Fatalf("QueueFrame of a %d-byte payload: %v", size, queued)
		}
		ctx, cancel := context.WithTimeout(t.Context(), e.patience)
		r := e.readWithin(t, ctx, p.client)
		cancel()
		switch {
		case r.err != nil && ctx.Err() != nil:
			t.Fatalf("a frame with a %d-byte payload queued with QueueFrame, and nothing written after it, did not arrive within %s; "+
				"the connection's writer must send what is queued without waiting for another write (the server queues the last answer of a burst)", size, e.patience)
		case r.err != nil:
			t.Fatalf("ReadFrame, waiting for a queued frame with a %d-byte payload: %v", size, r.err)
		}
		d := transportDiff(r.f, want)
		r.f.Release()
		if d != "" {
			t.Fatalf("a frame queued with QueueFrame arrived changed: %s", d)
		}
	}
}

// queueInOrder sends the frames of one call through QueueFrame and
// WriteFrame in turn, as a stream's sender does: they arrive in the order
// written, whichever way each went.
func (e *transportEnv) queueInOrder(t tb) {
	p := e.pair(t)
	q := queuer(t, p.client)
	werr := make(chan error, 1)
	transportGo(t, func() {
		for i := range transportOptionalFrames {
			f := transportSample(p.client, 7, i, optionalSize(i))
			write, how := p.client.WriteFrame, "WriteFrame"
			if i%3 != 2 {
				write, how = q.QueueFrame, "QueueFrame"
			}
			if err := write(f); err != nil {
				werr <- fmt.Errorf("%s of frame %d: %w", how, i, err)
				return
			}
		}
		werr <- nil
	})
	for i := range transportOptionalFrames {
		got := e.recv(t, p.server)
		d := transportDiff(got, transportSample(nil, 7, i, optionalSize(i)))
		seq := got.Metadata["seq"]
		got.Release()
		if seq != strconv.Itoa(i) {
			t.Fatalf("frame %d of call 7, sent by QueueFrame and WriteFrame in turn, arrived as frame %s; "+
				"a queued frame must go out before a frame written after it", i, seq)
		}
		if d != "" {
			t.Fatalf("frame %d of call 7, sent by QueueFrame and WriteFrame in turn, arrived changed: %s", i, d)
		}
	}
	if err := <-werr; err != nil {
		t.Errorf("%v", err)
	}
}

func (e *transportEnv) halfClose(t tb) {
	t.Run("SendsThenEnds", e.halfCloseSends)
	t.Run("ReadsOn", e.halfCloseReadsOn)
}

// halfCloser returns c's CloseWrite, skipping t if it has none.
func halfCloser(t tb, c kernel.Conn) kernel.HalfCloser {
	t.Helper()
	h, ok := c.(kernel.HalfCloser)
	if !ok {
		t.Skipf("the connection (%T) does not implement kernel.HalfCloser", c)
	}
	return h
}

// halfCloseSends half-closes a server connection right after writing
// (and, where it can, queueing) frames, as a draining server does after
// its last answers and its GoAway: the client reads every one, in order,
// and then an error, not a wait for frames that will never come.
func (e *transportEnv) halfCloseSends(t tb) {
	p := e.pair(t)
	h := halfCloser(t, p.server)
	q, queues := p.server.(kernel.FrameQueuer)
	for i := range transportOptionalFrames {
		f := transportSample(p.server, 9, i, optionalSize(i))
		if i == transportOptionalFrames-1 {
			f.Type, f.Flags, f.Message = kernel.FrameGoAway, 0, "draining"
		}
		write, how := p.server.WriteFrame, "WriteFrame"
		if queues && i%2 == 1 {
			write, how = q.QueueFrame, "QueueFrame"
		}
		if err := write(f); err != nil {
			t.Fatalf("%s of frame %d: %v", how, i, err)
		}
	}
	closed, ok := transportDo(t, e.patience, h.CloseWrite)
	switch {
	case !ok:
		t.Fatalf("CloseWrite did not return within %s", e.patience)
	case closed != nil:
		t.Fatalf("CloseWrite of a healthy connection: %v", closed)
	}
	for i := range transportOptionalFrames {
		want := transportSample(nil, 9, i, optionalSize(i))
		if i == transportOptionalFrames-1 {
			want.Type, want.Flags, want.Message = kernel.FrameGoAway, 0, "draining"
		}
		ctx, cancel := context.WithTimeout(t.Context(), e.patience)
		r := e.readWithin(t, ctx, p.client)
		cancel()
		if r.err != nil {
			t.Fatalf("frame %d of %d, written before CloseWrite, did not arrive (ReadFrame: %v); "+
				"CloseWrite sends every frame already written or queued before it tells the peer that no more will come", i, transportOptionalFrames, r.err)
		}
		d, seq := transportDiff(r.f, want), r.f.Metadata["seq"]
		r.f.Release()
		if seq != strconv.Itoa(i) {
			t.Fatalf("frame %d of %d, written before CloseWrite, arrived as frame %s; CloseWrite sends every frame already "+
				"written or queued, in order, before it tells the peer that no more will come", i, transportOptionalFrames, seq)
		}
		if d != "" {
			t.Fatalf("frame %d of %d, written before CloseWrite, arrived changed: %s", i, transportOptionalFrames, d)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	r := e.readWithin(t, ctx, p.client)
	switch {
	case r.err == nil:
		r.f.Release()
		t.Fatalf("after the peer's CloseWrite, ReadFrame returned a frame nobody sent; want an error")
	case ctx.Err() != nil:
		t.Fatalf("the peer called CloseWrite, but ReadFrame here still waited for a frame %s later (it returned %v); "+
			"CloseWrite must tell the peer that no more frames will come, so that a client of a draining server closes its end", e.patience, r.err)
	}
}

// halfCloseReadsOn half-closes a server connection with a request on its
// way in, as a draining server does, and reads the request: the read
// side stays open. Once the client closes its end, as it does on seeing
// the end, a read pending here fails and the half-closed connection is
// dead: the draining server waits for that.
func (e *transportEnv) halfCloseReadsOn(t tb) {
	p := e.pair(t)
	h := halfCloser(t, p.server)
	e.exchange(t, p.client, p.server, 1, 100)
	if err := p.client.WriteFrame(transportSample(p.client, 2, 0, 100)); err != nil {
		t.Fatalf("WriteFrame: %v", err)
	}
	closed, ok := transportDo(t, e.patience, h.CloseWrite)
	switch {
	case !ok:
		t.Fatalf("CloseWrite did not return within %s", e.patience)
	case closed != nil:
		t.Fatalf("CloseWrite of a healthy connection: %v", closed)
	}
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	r := e.readWithin(t, ctx, p.server)
	if r.err != nil {
		t.Fatalf("a request the peer wrote before CloseWrite could not be read after it (ReadFrame: %v); "+
			"CloseWrite closes the write side only: frames from the peer can still be read", r.err)
	}
	d := transportDiff(r.f, transportSample(nil, 2, 0, 100))
	r.f.Release()
	if d != "" {
		t.Fatalf("a request read after CloseWrite arrived changed: %s", d)
	}
	// The server's reader waits on, as the engine's does: the peer's
	// Close must end that wait, and the connection.
	p.client.Close()
	r = e.readWithin(t, ctx, p.server)
	switch {
	case r.err == nil:
		r.f.Release()
		t.Fatalf("after CloseWrite here and Close at the peer, ReadFrame returned a frame nobody sent; want an error")
	case ctx.Err() != nil:
		t.Fatalf("after CloseWrite here and Close at the peer, ReadFrame noticed nothing within %s (it returned %v); "+
			"a draining server reads until the client closes its end", e.patience, r.err)
	}
	if !transportWaitDone(p.server, e.patience) {
		t.Errorf("after CloseWrite here and Close at the peer, ReadFrame failed (%v) but Done did not close within %s; "+
			"a draining server waits on Done for the client to close its end", r.err, e.patience)
	}
}
