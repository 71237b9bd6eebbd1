package plugintest

import (
	"context"
	"errors"
	"flag"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportIdleFlag lengthens the Idle checks without a code change:
//
//	go test -run TestConformance/Idle -plugintest.idle=20s
var transportIdleFlag = flag.Duration("plugintest.idle", 0,
	"how long plugintest.Transport's Idle checks leave a connection unused, overriding TransportConfig.Idle "+
		"(set it above the transport's keepalive interval plus timeout)")

// idleChecks leaves healthy connections unused and then uses them again.
func (e *transportEnv) idleChecks(t tb) {
	t.Run("Unused", e.idleUnused)
	t.Run("AwaitingAnswer", e.idleAwaitingAnswer)
}

// idleAlive fails t if either end of p died.
func (e *transportEnv) idleAlive(t tb, p transportPair, how string) {
	t.Helper()
	for _, end := range []struct {
		name string
		c    kernel.Conn
	}{{"client", p.client}, {"server", p.server}} {
		select {
		case <-end.c.Done():
			t.Fatalf("a healthy connection %s for %s died at the %s end (Err: %v); a connection whose peer is alive must stay usable however long it waits",
				how, e.idle, end.name, end.c.Err())
		default:
		}
		if err := end.c.Err(); err != nil {
			t.Fatalf("a healthy connection %s for %s has an error at the %s end: %v, though its Done is open", how, e.idle, end.name, err)
		}
	}
}

// idleUnused exchanges frames, leaves the connection with nothing pending
// for the idle period, and exchanges frames again.
func (e *transportEnv) idleUnused(t tb) {
	p := e.pair(t)
	e.exchange(t, p.client, p.server, 1, 1<<10)
	e.exchange(t, p.server, p.client, 2, 1<<10)
	select {
	case <-time.After(e.idle):
	case <-t.Context().Done():
		return
	}
	e.idleAlive(t, p, "left unused")
	e.exchange(t, p.client, p.server, 3, 1<<10)
	e.exchange(t, p.server, p.client, 4, 1<<10)
}

// idleAwaitingAnswer is a slow call as the kernel makes it: the client
// writes a request and waits in ReadFrame; the server, its read loop
// waiting in ReadFrame as ever, answers only after the idle period. The
// connection must carry the answer and the frames after it: waiting for
// a slow peer is not a dead peer.
func (e *transportEnv) idleAwaitingAnswer(t tb) {
	p := e.pair(t)
	ctx, cancel := context.WithTimeout(t.Context(), e.idle+e.patience)
	defer cancel()
	request := transportSample(nil, 1, 0, 100)
	answer := transportSample(nil, 1, 1, 200)
	answer.Type = kernel.FrameResponse
	after := transportSample(nil, 2, 0, 300)

	served := make(chan string, 1)
	transportGo(t, func() {
		f, err := transportRead(ctx, p.server)
		if err != nil {
			served <- "the server's ReadFrame of the request: " + err.Error()
			return
		}
		d := transportDiff(f, request)
		f.Release()
		if d != "" {
			served <- "the request arrived changed: " + d
			return
		}
		// The read loop waits for the next request while the handler runs.
		next := make(chan transportReadResult, 1)
		transportGo(t, func() {
			f, err := transportRead(ctx, p.server)
			next <- transportReadResult{f, err}
		})
		select {
		case <-time.After(e.idle):
		case <-ctx.Done():
			served <- "gave up"
			return
		}
		w := transportHeader(answer)
		w.Payload = append(p.server.Buffer(len(answer.Payload)), answer.Payload...)
		if err := p.server.WriteFrame(w); err != nil {
			served <- "the server's WriteFrame of the answer, after " + e.idle.String() + ": " + err.Error()
			return
		}
		r := <-next
		if r.err != nil {
			served <- "the server's ReadFrame, pending while the answer was due, failed: " + r.err.Error()
			return
		}
		d = transportDiff(r.f, after)
		r.f.Release()
		if d != "" {
			served <- "the frame the client wrote after the answer arrived changed: " + d
			return
		}
		served <- ""
	})

	w := transportHeader(request)
	w.Payload = append(p.client.Buffer(len(request.Payload)), request.Payload...)
	if err := p.client.WriteFrame(w); err != nil {
		t.Fatalf("client WriteFrame of the request: %v", err)
	}
	r := e.readWithin(t, ctx, p.client)
	switch {
	case r.err != nil && errors.Is(r.err, context.DeadlineExceeded):
		t.Fatalf("the answer, written by the server %s after the request, did not arrive within %s more (ReadFrame: %v)", e.idle, e.patience, r.err)
	case r.err != nil:
		t.Fatalf("the client's ReadFrame, waiting %s for the answer to its request, failed: %v; a peer slow to answer is alive "+
			"(its ReadFrame was pending all along): keepalive must probe it and get an answer rather than declare the connection dead", e.idle, r.err)
	}
	d := transportDiff(r.f, answer)
	r.f.Release()
	if d != "" {
		t.Fatalf("the answer that came %s after its request arrived changed: %s", e.idle, d)
	}
	w = transportHeader(after)
	w.Payload = append(p.client.Buffer(len(after.Payload)), after.Payload...)
	if err := p.client.WriteFrame(w); err != nil {
		t.Fatalf("client WriteFrame after the slow answer: %v", err)
	}
	select {
	case msg := <-served:
		if msg != "" {
			t.Fatalf("a call answered after %s: %s", e.idle, msg)
		}
	case <-time.After(e.idle + 2*e.patience):
		t.Fatalf("the server side of a call answered after %s did not finish within %s", e.idle, e.idle+2*e.patience)
	}
	e.idleAlive(t, p, "that waited for an answer")
	e.exchange(t, p.server, p.client, 3, 1<<10)
}
