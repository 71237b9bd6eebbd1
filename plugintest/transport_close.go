package plugintest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// pendingRead starts c.ReadFrame(ctx) on a goroutine of its own and
// returns what it will return.
func (e *transportEnv) pendingRead(t tb, ctx context.Context, c kernel.Conn) <-chan transportReadResult {
	ch := make(chan transportReadResult, 1)
	started := make(chan struct{})
	transportGo(t, func() {
		close(started)
		f, err := transportRead(ctx, c)
		ch <- transportReadResult{f, err}
	})
	<-started
	// Nothing tells when ReadFrame is blocked inside the transport; a short
	// pause makes it likely that what follows finds it pending rather than
	// racing ahead of it. Either way the outcome checked is the same.
	time.Sleep(20 * time.Millisecond)
	return ch
}

// wait waits at most patience for a pending read.
func (e *transportEnv) wait(ch <-chan transportReadResult) (transportReadResult, bool) {
	timer := time.NewTimer(e.patience)
	defer timer.Stop()
	select {
	case r := <-ch:
		return r, true
	case <-timer.C:
		return transportReadResult{}, false
	}
}

// close checks what Close does to pending and later operations, on
// connections and listeners.
func (e *transportEnv) close(t tb) {
	t.Run("UnblocksRead", func(t tb) {
		p := e.pair(t)
		pending := e.pendingRead(t, t.Context(), p.client)
		if err := p.client.Close(); err != nil {
			t.Errorf("Close: %v; want nil", err)
		}
		r, ok := e.wait(pending)
		switch {
		case !ok:
			t.Errorf("a ReadFrame pending when Close was called was still blocked %s later; Close must wake it with an error wrapping kernel.ErrClosed", e.patience)
		case r.err == nil:
			r.f.Release()
			t.Errorf("a ReadFrame pending when Close was called returned a frame nobody sent; want an error wrapping kernel.ErrClosed")
		case !errors.Is(r.err, kernel.ErrClosed):
			t.Errorf("a ReadFrame pending when Close was called returned %v; want an error wrapping kernel.ErrClosed", r.err)
		}
	})
	t.Run("UnblocksPeerRead", func(t tb) {
		p := e.pair(t)
		pending := e.pendingRead(t, t.Context(), p.server)
		if err := p.client.Close(); err != nil {
			t.Errorf("Close: %v; want nil", err)
		}
		r, ok := e.wait(pending)
		switch {
		case !ok:
			t.Fatalf("the peer's pending ReadFrame was still blocked %s after Close; a closed connection must wake the other side with an error", e.patience)
		case r.err == nil:
			r.f.Release()
			t.Fatalf("the peer's pending ReadFrame returned a frame nobody sent after Close; want an error")
		}
		if !transportWaitDone(p.server, e.patience) {
			t.Errorf("the peer's ReadFrame failed after Close (%v), but its Done did not close within %s", r.err, e.patience)
		} else if p.server.Err() == nil {
			t.Errorf("the peer's Done closed after Close, but its Err is nil; Err must say why the connection died")
		}
	})
	t.Run("UnblocksWrite", func(t tb) { e.closeBlockedWriter(t, false) })
	t.Run("UnblocksPeerWrite", func(t tb) { e.closeBlockedWriter(t, true) })
	t.Run("OperationsFail", e.operationsAfterClose)
	t.Run("Twice", func(t tb) {
		p := e.pair(t)
		for i := range 2 {
			err, ok := transportDo(t, e.patience, func() error { return transportClose(p.client) })
			switch {
			case !ok:
				t.Errorf("Close number %d did not return within %s; Close must be idempotent, and return at once", i+1, e.patience)
			case err != nil && !errors.Is(err, kernel.ErrClosed):
				t.Errorf("Close number %d: %v; Close must be idempotent (nil, or an error wrapping kernel.ErrClosed)", i+1, err)
			}
		}
		// The server end from two goroutines at once, as a server shutting
		// down and a failing call might close it.
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { defer transportCatch(t); errs[i] = transportClose(p.server) })
		}
		if _, ok := transportDo(t, e.patience, func() struct{} { wg.Wait(); return struct{}{} }); !ok {
			t.Fatalf("two concurrent Close calls did not both return within %s", e.patience)
		}
		for _, err := range errs {
			if err != nil && !errors.Is(err, kernel.ErrClosed) {
				t.Errorf("Close called from two goroutines at once: %v; want nil or an error wrapping kernel.ErrClosed", err)
			}
		}
	})
	t.Run("UnblocksAccept", func(t tb) {
		tr := e.transport(t)
		l := e.listen(t, tr)
		accepted := make(chan transportConnErr, 1)
		started := make(chan struct{})
		transportGo(t, func() {
			close(started)
			c, err := l.Accept(t.Context())
			accepted <- transportConnErr{c, err}
		})
		<-started
		time.Sleep(20 * time.Millisecond) // as in pendingRead
		if err := l.Close(); err != nil {
			t.Errorf("listener Close: %v; want nil", err)
		}
		timer := time.NewTimer(e.patience)
		defer timer.Stop()
		select {
		case a := <-accepted:
			if a.err == nil {
				a.c.Close()
				t.Errorf("an Accept pending when the listener closed returned a connection nobody dialled")
			} else if !errors.Is(a.err, kernel.ErrClosed) {
				t.Errorf("an Accept pending when the listener closed returned %v; want an error wrapping kernel.ErrClosed", a.err)
			}
		case <-timer.C:
			t.Errorf("an Accept pending when the listener closed was still blocked %s later; Close must wake it with an error wrapping kernel.ErrClosed", e.patience)
		}
		ctx, cancel := context.WithTimeout(t.Context(), e.patience)
		defer cancel()
		a, ok := transportDo(t, 2*e.patience, func() transportConnErr {
			c, err := l.Accept(ctx)
			return transportConnErr{c, err}
		})
		switch {
		case !ok:
			t.Errorf("Accept after the listener closed blocked past its context's deadline")
		case a.err == nil:
			a.c.Close()
			t.Errorf("Accept after the listener closed returned a connection")
		case !errors.Is(a.err, kernel.ErrClosed):
			t.Errorf("Accept after the listener closed: %v; want an error wrapping kernel.ErrClosed", a.err)
		}
	})
	t.Run("ListenerLeavesConns", func(t tb) {
		p := e.pair(t)
		if err := p.l.Close(); err != nil {
			t.Errorf("listener Close: %v; want nil", err)
		}
		e.exchange(t, p.client, p.server, 1, 1<<10)
		e.exchange(t, p.server, p.client, 2, 1<<10)
	})
}

// transportClose is c.Close, with a panic made an error for the report:
// the suite calls it on goroutines of its own, where a panic would end the
// test binary.
func transportClose(c kernel.Conn) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panicked: %v", v)
		}
	}()
	return c.Close()
}

// closeBlockedWriter writes to a peer that reads nothing until WriteFrame
// blocks, then closes the writing end (or, with peer, the other end): the
// blocked WriteFrame must fail.
func (e *transportEnv) closeBlockedWriter(t tb, peer bool) {
	p := e.pair(t)
	size := e.capped(256 << 10)
	template := transportFill(nil, 1, size)
	var written atomic.Int64
	result := make(chan error, 1)
	transportGo(t, func() {
		// 32MiB is more than any connection should buffer.
		for range (32<<20)/size + 1 {
			f := transportHeader(transportSample(nil, 1, 0, 0))
			f.Payload = append(p.client.Buffer(size), template...)
			if err := p.client.WriteFrame(f); err != nil {
				result <- err
				return
			}
			written.Add(1)
		}
		result <- nil
	})
	// Wait until the writer stops making progress: blocked, as the subtest
	// wants it. Should it not be blocked yet, Close still must make its
	// next write fail, and what is checked is the same.
	transportAwaitStall(&written, e.patience)
	closer, side := p.client, "its own"
	if peer {
		closer, side = p.server, "the peer's"
	}
	if err := closer.Close(); err != nil {
		t.Errorf("Close: %v; want nil", err)
	}
	timer := time.NewTimer(e.patience)
	defer timer.Stop()
	select {
	case err := <-result:
		switch {
		case err == nil:
			t.Skipf("WriteFrame never blocked: the transport took 32MiB for a peer that reads nothing, so no write was pending when %s Close came", side)
		case !peer && !errors.Is(err, kernel.ErrClosed):
			t.Errorf("a WriteFrame blocked when Close was called returned %v; want an error wrapping kernel.ErrClosed", err)
		}
	case <-timer.C:
		t.Errorf("a WriteFrame blocked on a peer that reads nothing was still blocked %s after %s Close (%d frames of %d bytes written before); Close must wake it with an error",
			e.patience, side, written.Load(), size)
	}
}

// operationsAfterClose checks a closed connection: dead, and failing
// every operation with kernel.ErrClosed.
func (e *transportEnv) operationsAfterClose(t tb) {
	p := e.pair(t)
	c := p.client
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v; want nil", err)
	}
	if !transportWaitDone(c, e.patience) {
		t.Errorf("Done was not closed %s after Close returned", e.patience)
	}
	if err := c.Err(); err == nil {
		t.Errorf("Err is nil after Close; want an error wrapping kernel.ErrClosed")
	} else if !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("Err after Close: %v; want an error wrapping kernel.ErrClosed", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	r, ok := e.read(t, ctx, c)
	switch {
	case !ok:
		t.Errorf("ReadFrame after Close blocked past its context's deadline; want an error wrapping kernel.ErrClosed at once")
	case r.err == nil:
		r.f.Release()
		t.Errorf("ReadFrame after Close returned a frame; want an error wrapping kernel.ErrClosed")
	case !errors.Is(r.err, kernel.ErrClosed):
		t.Errorf("ReadFrame after Close: %v; want an error wrapping kernel.ErrClosed", r.err)
	}

	f := transportSample(c, 1, 0, 100)
	err, ok := transportDo(t, e.patience, func() error { return c.WriteFrame(f) })
	switch {
	case !ok:
		t.Errorf("WriteFrame after Close did not return within %s", e.patience)
	case err == nil:
		t.Errorf("WriteFrame after Close succeeded; want an error wrapping kernel.ErrClosed, so that the caller knows its frame was not sent")
	case !errors.Is(err, kernel.ErrClosed):
		t.Errorf("WriteFrame after Close: %v; want an error wrapping kernel.ErrClosed", err)
	}
	// Buffers may still be asked for and given back by callers racing Close.
	c.Recycle(c.Buffer(100))
}

// peerGone closes one end and checks that the other notices.
func (e *transportEnv) peerGone(t tb) {
	for _, side := range []struct {
		name    string
		watcher func(transportPair) (watcher, gone kernel.Conn)
	}{
		{"ServerNotices", func(p transportPair) (kernel.Conn, kernel.Conn) { return p.server, p.client }},
		{"ClientNotices", func(p transportPair) (kernel.Conn, kernel.Conn) { return p.client, p.server }},
	} {
		t.Run(side.name, func(t tb) {
			p := e.pair(t)
			watcher, gone := side.watcher(p)
			e.exchange(t, gone, watcher, 1, 10)
			e.exchange(t, watcher, gone, 2, 10)
			gone.Close()
			ctx, cancel := context.WithTimeout(t.Context(), e.patience)
			defer cancel()
			r := e.readWithin(t, ctx, watcher)
			switch {
			case r.err == nil:
				r.f.Release()
				t.Fatalf("after the peer closed, ReadFrame returned a frame nobody sent")
			case ctx.Err() != nil:
				t.Fatalf("the peer closed its connection, but ReadFrame here noticed nothing within %s (it returned %v); a vanished peer must fail ReadFrame", e.patience, r.err)
			}
			if !transportWaitDone(watcher, e.patience) {
				t.Fatalf("ReadFrame failed after the peer closed (%v), but Done did not close within %s", r.err, e.patience)
			}
			if err := watcher.Err(); !errors.Is(err, kernel.ErrPeerGone) {
				t.Errorf("Err after the peer closed: %v; want an error wrapping kernel.ErrPeerGone", err)
			}
		})
	}
}

// dial checks that Dial fails promptly where nothing listens and honours
// its context.
func (e *transportEnv) dial(t tb) {
	t.Run("ClosedAddress", func(t tb) {
		tr := e.transport(t)
		l := e.listen(t, tr)
		addr := l.Addr()
		if err := l.Close(); err != nil {
			t.Fatalf("listener Close: %v", err)
		}
		e.dialFails(t, tr, addr, "the address of a closed listener")
	})
	t.Run("WrongAddress", func(t tb) {
		e.dialFails(t, e.transport(t), e.wrongAddress(t), "an address no listener can be at")
	})
	for _, c := range []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
		want error
	}{
		{"Cancelled", func(parent context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(parent)
			cancel()
			return ctx, cancel
		}, context.Canceled},
		{"Expired", func(parent context.Context) (context.Context, context.CancelFunc) {
			return context.WithDeadline(parent, time.Now().Add(-time.Second))
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t tb) {
			tr := e.transport(t)
			l := e.listen(t, tr)
			ctx, cancel := c.ctx(t.Context())
			defer cancel()
			d, ok := transportDo(t, e.patience, func() transportConnErr {
				conn, err := tr.Dial(ctx, l.Addr())
				return transportConnErr{conn, err}
			})
			switch {
			case !ok:
				t.Errorf("Dial with a done context did not return within %s", e.patience)
			case d.err == nil:
				d.c.Close()
				t.Errorf("Dial with a done context (%v) succeeded; Dial must honour its context", c.want)
			case !errors.Is(d.err, c.want):
				t.Errorf("Dial with a done context: %v; want an error wrapping %v", d.err, c.want)
			}
		})
	}
	// A dial the listener never accepts must end with its context, by
	// deadline or by cancellation: the engine dials on the goroutine of a
	// caller, which its context must free. Either outcome is right (some
	// transports connect without Accept); waiting past the end is not.
	const after = 100 * time.Millisecond
	for _, c := range []struct {
		name, end string
		ctx       func(context.Context) (context.Context, context.CancelFunc)
	}{
		{"NotAccepted", "deadline", func(parent context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(parent, after)
		}},
		{"NotAcceptedCancelled", "cancellation", func(parent context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(parent)
			stop := time.AfterFunc(after, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}},
	} {
		t.Run(c.name, func(t tb) {
			tr := e.transport(t)
			l := e.listen(t, tr)
			ctx, cancel := c.ctx(t.Context())
			defer cancel()
			d, ok := transportDo(t, after+e.patience, func() transportConnErr {
				conn, err := tr.Dial(ctx, l.Addr())
				return transportConnErr{conn, err}
			})
			if !ok {
				t.Fatalf("Dial to a listener that does not accept was still blocked %s after its context's %s (%s in); Dial must honour its context", e.patience, c.end, after)
			}
			if d.err == nil {
				d.c.Close()
			}
		})
	}
}

// dialFails checks that dialling addr fails before the deadline does.
func (e *transportEnv) dialFails(t tb, tr kernel.Transport, addr, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	d, ok := transportDo(t, 2*e.patience, func() transportConnErr {
		c, err := tr.Dial(ctx, addr)
		return transportConnErr{c, err}
	})
	switch {
	case !ok:
		t.Fatalf("Dial(%q), %s, blocked past its %s deadline", addr, what, e.patience)
	case d.err == nil:
		d.c.Close()
		t.Errorf("Dial(%q), %s, succeeded; want an error", addr, what)
	case ctx.Err() != nil || errors.Is(d.err, context.DeadlineExceeded):
		t.Errorf("Dial(%q), %s, failed only when its %s deadline expired (%v); it must fail promptly when nothing can answer", addr, what, e.patience, d.err)
	}
}

// deadline checks that ReadFrame and Accept honour their contexts and that
// an interrupted call leaves the connection or listener usable.
func (e *transportEnv) deadline(t tb) {
	for _, c := range []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
		want error
	}{
		{"ReadCancelled", func(parent context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(parent)
			cancel()
			return ctx, cancel
		}, context.Canceled},
		// Long enough for ReadFrame to block before the deadline strikes.
		{"ReadExpires", func(parent context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(parent, 50*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t tb) {
			p := e.pair(t)
			ctx, cancel := c.ctx(t.Context())
			defer cancel()
			r, ok := e.read(t, ctx, p.server)
			switch {
			case !ok:
				t.Fatalf("ReadFrame with a done context was still blocked %s after it was done; ReadFrame must honour its context", e.patience)
			case r.err == nil:
				r.f.Release()
				t.Fatalf("ReadFrame returned a frame nobody sent")
			case !errors.Is(r.err, c.want):
				t.Errorf("ReadFrame with a done context: %v; want ctx's error, wrapping %v", r.err, c.want)
			}
			if err := p.server.Err(); err != nil {
				t.Fatalf("ReadFrame's context ended and so did the connection (Err: %v); the connection must stay usable", err)
			}
			e.exchange(t, p.client, p.server, 3, 1<<10)
		})
	}
	t.Run("ReadResumes", e.readResumes)
	t.Run("Accept", func(t tb) {
		tr := e.transport(t)
		l := e.listen(t, tr)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		a, ok := transportDo(t, e.patience, func() transportConnErr {
			c, err := l.Accept(ctx)
			return transportConnErr{c, err}
		})
		switch {
		case !ok:
			t.Fatalf("Accept with a 50ms deadline and nobody dialling was still blocked %s later; Accept must honour its context", e.patience)
		case a.err == nil:
			a.c.Close()
			t.Fatalf("Accept returned a connection nobody dialled")
		case !errors.Is(a.err, context.DeadlineExceeded):
			t.Errorf("Accept past its deadline: %v; want ctx's error, wrapping context.DeadlineExceeded", a.err)
		}
		client, server := e.connect(t, tr, l)
		e.exchange(t, client, server, 1, 1<<10)
	})
}

// readResumes reads large frames with contexts that keep expiring, often
// in the middle of a frame, and checks that nothing is lost or garbled.
func (e *transportEnv) readResumes(t tb) {
	const n = 16
	p := e.pair(t)
	size := e.capped(256 << 10)
	// Lockstep: each frame is written only once the reader waits for it,
	// so that it arrives while reads are being interrupted, not before.
	turn := make(chan struct{}, 1)
	werr := make(chan error, 1)
	transportGo(t, func() {
		for i := range n {
			select {
			case <-turn:
			case <-t.Context().Done():
				werr <- t.Context().Err()
				return
			}
			// Late enough that the reader's short deadline has struck at
			// least once: every frame comes after an interrupted read.
			time.Sleep(2 * time.Millisecond)
			if err := p.client.WriteFrame(transportSample(p.client, 5, i, size)); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	})
	giveUp := time.Now().Add(e.patience)
	interrupted := 0
	turn <- struct{}{}
	for i := 0; i < n; {
		if time.Now().After(giveUp) {
			t.Fatalf("only %d of %d frames of %d bytes arrived within %s under interrupted reads (%d interruptions)", i, n, size, e.patience, interrupted)
		}
		// 25µs to 1ms: often shorter than one frame takes to arrive.
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1+(i*7+interrupted)%40)*25*time.Microsecond)
		r := e.readWithin(t, ctx, p.server)
		cancel()
		switch {
		case r.err != nil && errors.Is(r.err, context.DeadlineExceeded):
			interrupted++
			continue
		case r.err != nil:
			t.Fatalf("after %d interrupted reads, ReadFrame failed: %v; an interrupted ReadFrame must leave the connection usable", interrupted, r.err)
		}
		if d := transportDiff(r.f, transportSample(nil, 5, i, size)); d != "" {
			r.f.Release()
			t.Fatalf("frame %d of %d, read after %d interruptions, arrived changed: %s; an interrupted ReadFrame must resume where it stopped", i, n, interrupted, d)
		}
		r.f.Release()
		if i++; i < n {
			turn <- struct{}{}
		}
	}
	if err := <-werr; err != nil {
		t.Errorf("WriteFrame: %v", err)
	}
	t.Logf("%d frames of %d bytes read through %d interruptions", n, size, interrupted)
}

// transportAwaitStall waits until written has not grown for five looks
// 10ms apart (its writer waits on a peer that reads nothing), or until
// patience has passed.
func transportAwaitStall(written *atomic.Int64, patience time.Duration) {
	for last, still, giveUp := int64(-1), 0, time.Now().Add(patience); still < 5 && time.Now().Before(giveUp); {
		time.Sleep(10 * time.Millisecond)
		if n := written.Load(); n != last {
			last, still = n, 0
		} else {
			still++
		}
	}
}
