package plugintest

import (
	"slices"

	"github.com/kernrpc/kernrpc/kernel"
)

// memory checks Buffer and Recycle, and that memory the transport lends is
// not reused while lent.
func (e *transportEnv) memory(t tb) {
	t.Run("Buffer", func(t tb) {
		p := e.pair(t)
		largest := e.maxPayload(transportSample(nil, 4, 0, 0))
		// Both sides of every power of two a pool may size its classes by,
		// of cfg.LargeFrame, and the largest payload there is.
		hints := []int{0, 1, 1000, e.capped(64 << 10), largest}
		for k := 3; 1<<k-1 <= largest; k++ {
			hints = append(hints, 1<<k-1, 1<<k, 1<<k+1)
		}
		if L := e.cfg.LargeFrame; L > 0 {
			hints = append(hints, L-1, L, L+1)
		}
		slices.Sort(hints)
		hints = slices.Compact(hints)
		for _, hint := range hints {
			if hint > largest {
				continue
			}
			b := p.client.Buffer(hint)
			if len(b) != 0 || cap(b) < hint {
				t.Fatalf("Buffer(%d) returned len %d, cap %d; want an empty buffer with capacity for at least %d bytes", hint, len(b), cap(b), hint)
			}
			p.client.Recycle(transportFill(b, 1, hint))
			if hint > 64<<10+1 && hint != largest && hint != e.cfg.LargeFrame+1 {
				continue // the capacity is what matters; fewer large frames to send
			}
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
		p := e.pair(t)
		why := e.reuseRule(p.tr)
		for _, size := range e.heldSizes(100, 4<<10, e.capped(64<<10)) {
			want := transportSample(nil, 1, 0, size)
			held := e.transfer(t, p.client, p.server, want)
			// Traffic both ways, of the same size, with every frame
			// released and every buffer recycled: what a pool reuses.
			for i := 1; i <= e.heldRounds(size); i++ {
				e.transfer(t, p.client, p.server, transportSample(nil, 2, i, size)).Release()
				e.transfer(t, p.server, p.client, transportSample(nil, 3, i, size)).Release()
				p.server.Recycle(p.server.Buffer(size))
			}
			if d := transportDiff(held, want); d != "" {
				t.Errorf("a received %d-byte frame held without Release changed while more frames arrived: %s; %s%s",
					size, d, why, e.largeNote(transportBodyLen(want)+size))
			}
			held.Release()
		}
	})
	t.Run("HeldBuffer", func(t tb) {
		p := e.pair(t)
		why := e.reuseRule(p.tr)
		for _, size := range e.heldSizes(4 << 10) {
			held := transportFill(p.client.Buffer(size), 1, size)
			for i := 2; i < 2+2*e.heldRounds(size); i++ {
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
				t.Errorf("a Buffer(%d) neither written nor recycled changed while other buffers were handed out, written and recycled: %s; %s",
					size, d, why)
			}
			p.client.Recycle(held)
		}
	})
}

// heldSizes are the payload sizes the hold checks use: small ones, then
// one that puts the frame just above cfg.LargeFrame (the transport's other
// path), and one just over 1MiB, where pools commonly stop (capped by
// the maximum).
func (e *transportEnv) heldSizes(small ...int) []int {
	sizes := small
	hl := transportBodyLen(transportSample(nil, 1, 0, 0))
	if L := e.cfg.LargeFrame; L > 0 {
		sizes = append(sizes, L+1-hl)
	}
	sizes = append(sizes, e.capped(1<<20+1))
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

// heldRounds is how many frames of size flow each way while one is held:
// fewer for large ones, which no pool keeps many of.
func (e *transportEnv) heldRounds(size int) int {
	switch {
	case size > 1<<20:
		return 4
	case size > 64<<10:
		return 8
	}
	return 32
}

// reuseRule says which rule a changed held payload or buffer broke: the
// lending rule, or, for a transport that does not declare lending, the
// rule that its memory is then the caller's for good.
func (e *transportEnv) reuseRule(tr kernel.Transport) string {
	if caps, ok := tr.(kernel.TransportCapabilities); ok && caps.LendsMemory() {
		return "the transport reused memory it had lent (it may reuse it only after Release, Recycle or WriteFrame)"
	}
	return "the transport does not declare lending (kernel.TransportCapabilities with LendsMemory true), so payloads and buffers are the caller's and must never be reused, " +
		"yet this one was; declare LendsMemory and reuse only after Release, Recycle or WriteFrame"
}
