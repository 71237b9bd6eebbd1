package plugintest

import (
	"context"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

// leaks exercises a listener and its connections in every way they end,
// closes them all and the transport, and then expects every goroutine
// started meanwhile to be gone.
func (e *transportEnv) leaks(t tb) {
	before := goleak.IgnoreCurrent()
	func() {
		// A subtest of its own would start a goroutine of its own; a
		// function scope is enough to close everything before checking.
		tr := build(t, e.f, e.cfg.Options)
		defer closePlugin(tr)
		ctx, cancel := context.WithTimeout(t.Context(), e.patience)
		defer cancel()
		l, err := tr.Listen(ctx, e.address(t))
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		defer l.Close()
		var conns []kernel.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range 3 {
			client, server := e.dialAccept(t, tr, l)
			conns = append(conns, client, server)
			e.exchange(t, client, server, 1, 1<<10)
			e.exchange(t, server, client, 2, e.capped(100<<10))
		}
		// One connection dies by its peer's hand, one with a read pending
		// on it, one by Close alone.
		conns[0].Close()
		r, ok := e.read(ctx, conns[1])
		if !ok {
			t.Fatalf("ReadFrame ignored its context: still blocked %s after the deadline", e.patience)
		}
		if r.err == nil {
			r.f.Release()
		}
		pending := e.pendingRead(ctx, conns[2])
		conns[2].Close()
		if _, ok := e.wait(pending); !ok {
			t.Fatalf("a ReadFrame pending when Close was called was still blocked %s later", e.patience)
		}
		// And the listener closes with an Accept pending.
		accepted := make(chan struct{})
		go func() {
			defer close(accepted)
			if c, err := l.Accept(ctx); err == nil {
				c.Close()
			}
		}()
		time.Sleep(20 * time.Millisecond) // as in pendingRead
		l.Close()
		if _, ok := transportDo(e.patience, func() struct{} { <-accepted; return struct{}{} }); !ok {
			t.Fatalf("an Accept pending when the listener closed was still blocked %s later", e.patience)
		}
	}()
	giveUp := time.Now().Add(e.patience)
	for {
		err := goleak.Find(before)
		if err == nil {
			return
		}
		if time.Now().After(giveUp) {
			t.Fatalf("goroutines still running %s after the listener, all its connections and the transport were closed; "+
				"a transport must stop every goroutine it started when the last of them closes:\n%v", e.patience, err)
		}
	}
}

// memory checks Buffer and Recycle, and that memory the transport lends is
// not reused while lent.
func (e *transportEnv) memory(t tb) {
	t.Run("Buffer", func(t tb) {
		p := e.pair(t)
		for _, hint := range []int{0, 1, 1000, e.capped(64 << 10), e.maxPayload(transportSample(nil, 4, 0, 0))} {
			b := p.client.Buffer(hint)
			if len(b) != 0 || cap(b) < hint {
				t.Fatalf("Buffer(%d) returned len %d, cap %d; want an empty buffer with capacity for at least %d bytes", hint, len(b), cap(b), hint)
			}
			p.client.Recycle(transportFill(b, 1, hint))
			// Whatever came back from the recycled buffer must carry a
			// frame as well as a fresh one does.
			want := transportSample(nil, 4, 0, hint)
			f := transportHeader(want)
			f.Payload = append(p.client.Buffer(hint), want.Payload...)
			got := e.transferFrame(t, p.client, p.server, f)
			if d := transportDiff(got, want); d != "" {
				t.Errorf("a frame written from a Buffer(%d) after a Recycle arrived changed: %s", hint, d)
			}
			got.Release()
		}
	})
	t.Run("ReleaseAfterClose", func(t tb) {
		p := e.pair(t)
		held := e.transfer(t, p.client, p.server, transportSample(nil, 1, 0, 1<<10))
		p.server.Close()
		// Callers release what they hold whenever they are done, and may
		// ask for buffers racing Close: neither may crash on a torn-down
		// pool.
		held.Release()
		p.server.Recycle(p.server.Buffer(1 << 10))
	})
	t.Run("HeldFrame", func(t tb) {
		e.needsLending(t)
		p := e.pair(t)
		for _, size := range []int{100, 4 << 10, e.capped(64 << 10)} {
			want := transportSample(nil, 1, 0, size)
			held := e.transfer(t, p.client, p.server, want)
			// Traffic both ways, of the same size, with every frame
			// released and every buffer recycled: what a pool reuses.
			for i := 1; i <= 32; i++ {
				e.transfer(t, p.client, p.server, transportSample(nil, 2, i, size)).Release()
				e.transfer(t, p.server, p.client, transportSample(nil, 3, i, size)).Release()
				p.server.Recycle(p.server.Buffer(size))
			}
			if d := transportDiff(held, want); d != "" {
				t.Errorf("a received %d-byte frame held without Release changed while more frames arrived: %s; "+
					"the transport reused memory it had lent (it may reuse it only after Release)", size, d)
			}
			held.Release()
		}
	})
	t.Run("HeldBuffer", func(t tb) {
		e.needsLending(t)
		p := e.pair(t)
		const size = 4 << 10
		held := transportFill(p.client.Buffer(size), 1, size)
		for i := 2; i < 34; i++ {
			b := transportFill(p.client.Buffer(size), uint64(i), size)
			if i%2 == 0 {
				p.client.Recycle(b)
				continue
			}
			want := transportSample(nil, 5, i, size)
			f := transportHeader(want)
			f.Payload = append(b[:0], want.Payload...)
			e.transferFrame(t, p.client, p.server, f).Release()
		}
		if d := transportPayloadDiff(held, transportFill(nil, 1, size)); d != "" {
			t.Errorf("a Buffer neither written nor recycled changed while other buffers were handed out, written and recycled: %s; "+
				"the transport handed out a buffer it had lent", d)
		}
		p.client.Recycle(held)
	})
}

// needsLending skips the subtest unless the transport lends memory.
func (e *transportEnv) needsLending(t tb) {
	t.Helper()
	tr := build(t, e.f, e.cfg.Options)
	defer closePlugin(tr)
	if caps, ok := tr.(kernel.TransportCapabilities); !ok || !caps.LendsMemory() {
		t.Skipf("the transport does not lend memory (it does not implement kernel.TransportCapabilities with LendsMemory true): payloads and buffers are the caller's, so there is no reuse to check")
	}
}
