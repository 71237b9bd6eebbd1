package plugintest

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

// leakChecks runs a transport through each way its listeners, dials and
// connections end, successful or not, and then expects every goroutine
// started and every file descriptor opened meanwhile to be gone.
func (e *transportEnv) leakChecks(t tb) {
	t.Run("ListenerAndConns", func(t tb) {
		e.noLeaks(t, "the listener, all its connections and the transport were closed", e.leakListenerAndConns)
	})
	t.Run("FailedDial", func(t tb) {
		e.noLeaks(t, "dials that failed (nothing listening) and the transport's Close", e.leakFailedDial)
	})
	t.Run("CancelledDial", func(t tb) {
		e.noLeaks(t, "dials whose context was cancelled or expired, before or while they ran, and the Close of everything", e.leakCancelledDial)
	})
	t.Run("CancelledAccept", func(t tb) {
		e.noLeaks(t, "Accepts whose context was cancelled or expired, the listener's Close and the transport's", e.leakCancelledAccept)
	})
}

// noLeaks runs body against a transport of its own and closes the
// transport; then no goroutine started meanwhile may be left, and (where
// the system lists them, on Linux) no file descriptor opened meanwhile.
// A first connection, made and closed before, lets the runtime open what
// it keeps for good (the network poller).
func (e *transportEnv) noLeaks(t tb, after string, body func(t tb, tr kernel.Transport, ctx context.Context)) {
	t.Helper()
	e.warmUp(t)
	before := goleak.IgnoreCurrent()
	fds := transportOpenFDs()
	func() {
		// A subtest of its own would start a goroutine of its own; a
		// function scope is enough to close everything before checking.
		tr := build(t, e.f, e.cfg.Options)
		defer closePlugin(tr)
		ctx, cancel := context.WithTimeout(t.Context(), e.patience)
		defer cancel()
		body(t, tr, ctx)
	}()
	giveUp := time.Now().Add(e.patience)
	for {
		gerr := goleak.Find(before)
		opened := transportNewFDs(fds, transportOpenFDs())
		if gerr == nil && len(opened) == 0 {
			return
		}
		if time.Now().After(giveUp) {
			if gerr != nil {
				t.Errorf("goroutines still running %s after %s; a transport must stop every goroutine it started when the last of its listeners, connections and itself closes, "+
					"whatever became of its dials and accepts:\n%v", e.patience, after, gerr)
			}
			if len(opened) > 0 {
				t.Errorf("file descriptors opened meanwhile still open %s after %s: %s; a transport must close every socket and file it opened, on failure and cancellation too",
					e.patience, after, strings.Join(opened, ", "))
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warmUp makes a connection, exchanges a frame and closes everything.
func (e *transportEnv) warmUp(t tb) {
	t.Helper()
	tr := build(t, e.f, e.cfg.Options)
	defer closePlugin(tr)
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()
	l, err := tr.Listen(ctx, e.address(t))
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	client, server := e.dialAccept(t, tr, l)
	defer client.Close()
	defer server.Close()
	e.exchange(t, client, server, 1, 1<<10)
}

// transportOpenFDs lists the process's open file descriptors with what
// each refers to; nil where the system does not list them.
func transportOpenFDs() map[string]string {
	if runtime.GOOS != "linux" {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	fds := make(map[string]string, len(entries))
	for _, de := range entries {
		target, err := os.Readlink("/proc/self/fd/" + de.Name())
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		fds[de.Name()] = target
	}
	return fds
}

// transportNewFDs describes the descriptors in now that were not in
// before (a number reused for something else counts as new).
func transportNewFDs(before, now map[string]string) []string {
	if before == nil || now == nil {
		return nil
	}
	var opened []string
	for fd, target := range now {
		if before[fd] != target {
			opened = append(opened, fd+" → "+target)
		}
	}
	slices.Sort(opened)
	return opened
}

// leakListenerAndConns ends connections in every way they end: by the
// peer's hand, with a read pending, by Close alone; and the listener with
// an Accept pending.
func (e *transportEnv) leakListenerAndConns(t tb, tr kernel.Transport, ctx context.Context) {
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
	conns[0].Close()
	if r := e.readWithin(t, ctx, conns[1]); r.err == nil {
		r.f.Release()
	}
	pending := e.pendingRead(t, ctx, conns[2])
	conns[2].Close()
	if _, ok := e.wait(pending); !ok {
		t.Fatalf("a ReadFrame pending when Close was called was still blocked %s later", e.patience)
	}
	accepted := make(chan struct{})
	transportGo(t, func() {
		defer close(accepted)
		if c, err := l.Accept(ctx); err == nil {
			c.Close()
		}
	})
	time.Sleep(20 * time.Millisecond) // as in pendingRead
	l.Close()
	if _, ok := transportDo(t, e.patience, func() struct{} { <-accepted; return struct{}{} }); !ok {
		t.Fatalf("an Accept pending when the listener closed was still blocked %s later", e.patience)
	}
}

// leakFailedDial dials where nothing listens: the address of a closed
// listener and one no listener can be at, with live and done contexts.
func (e *transportEnv) leakFailedDial(t tb, tr kernel.Transport, ctx context.Context) {
	l, err := tr.Listen(ctx, e.address(t))
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	closed := l.Addr()
	if err := l.Close(); err != nil {
		t.Fatalf("listener Close: %v", err)
	}
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	for range 3 {
		for _, addr := range []string{closed, e.wrongAddress(t)} {
			for _, dctx := range []context.Context{ctx, expired} {
				d, ok := transportDo(t, 2*e.patience, func() transportConnErr {
					c, err := tr.Dial(dctx, addr)
					return transportConnErr{c, err}
				})
				switch {
				case !ok:
					t.Fatalf("Dial(%q), where nothing listens, did not return within %s", addr, 2*e.patience)
				case d.err == nil:
					d.c.Close()
					t.Fatalf("Dial(%q), where nothing listens, succeeded", addr)
				}
			}
		}
	}
}

// leakCancelledDial dials a listener that accepts nothing, with contexts
// cancelled before the dial, cancelled while it runs (a transport with a
// handshake is still waiting for the listener then) and expiring while it
// runs. Whatever connected is closed, then the listener.
func (e *transportEnv) leakCancelledDial(t tb, tr kernel.Transport, ctx context.Context) {
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
	dial := func(dctx context.Context, how string) {
		d, ok := transportDo(t, 2*e.patience, func() transportConnErr {
			c, err := tr.Dial(dctx, l.Addr())
			return transportConnErr{c, err}
		})
		if !ok {
			t.Fatalf("Dial with a context %s did not return within %s", how, 2*e.patience)
		}
		if d.err == nil {
			conns = append(conns, d.c)
		}
	}
	for i := range 3 {
		wait := time.Duration(i+1) * 5 * time.Millisecond
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		dial(cctx, "cancelled before the dial")
		cctx, cancel = context.WithCancel(ctx)
		stop := time.AfterFunc(wait, cancel)
		dial(cctx, "cancelled "+wait.String()+" into the dial")
		stop.Stop()
		cancel()
		cctx, cancel = context.WithTimeout(ctx, wait)
		dial(cctx, "expiring "+wait.String()+" into the dial")
		cancel()
	}
}

// leakCancelledAccept waits in Accept with contexts cancelled before,
// cancelled during and expiring during the wait; then a connection is
// accepted as usual, and the listener closes right after another
// cancelled Accept.
func (e *transportEnv) leakCancelledAccept(t tb, tr kernel.Transport, ctx context.Context) {
	l, err := tr.Listen(ctx, e.address(t))
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	accept := func(how string, actx context.Context) {
		a, ok := transportDo(t, 2*e.patience, func() transportConnErr {
			c, err := l.Accept(actx)
			return transportConnErr{c, err}
		})
		switch {
		case !ok:
			t.Fatalf("Accept with a context %s did not return within %s", how, 2*e.patience)
		case a.err == nil:
			a.c.Close()
			t.Fatalf("Accept with a context %s returned a connection nobody dialled", how)
		}
	}
	cancelledDuring := func() {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		time.AfterFunc(20*time.Millisecond, cancel)
		accept("cancelled during the wait", actx)
	}
	for range 2 {
		actx, cancel := context.WithCancel(ctx)
		cancel()
		accept("cancelled before the wait", actx)
		cancelledDuring()
		actx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
		accept("expiring during the wait", actx)
		cancel()
	}
	client, server := e.dialAccept(t, tr, l)
	e.exchange(t, client, server, 1, 1<<10)
	client.Close()
	server.Close()
	cancelledDuring()
	if err := l.Close(); err != nil {
		t.Errorf("listener Close: %v", err)
	}
}
