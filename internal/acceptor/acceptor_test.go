package acceptor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// fakeConn is an accepted connection; its handshake waits on release.
type fakeConn struct {
	name    string
	release chan error // the handshake's outcome
	closed  atomic.Bool
}

func (c *fakeConn) Close() error { c.closed.Store(true); return nil }

// handshaken is a connection whose handshake ends at once with err.
func handshaken(name string, err error) *fakeConn {
	c := &fakeConn{name: name, release: make(chan error, 1)}
	c.release <- err
	return c
}

// readyConn is what a successful handshake hands to Accept.
type readyConn struct {
	kernel.Conn
	from *fakeConn
}

func (r readyConn) Close() error { return r.from.Close() }

// fakeListener feeds the acceptor the connections sent on incoming.
type fakeListener struct {
	incoming chan *fakeConn
	done     chan struct{}
	once     sync.Once
}

func newFakeListener() *fakeListener {
	return &fakeListener{incoming: make(chan *fakeConn), done: make(chan struct{})}
}

func (l *fakeListener) accept() (*fakeConn, error) {
	select {
	case c := <-l.incoming:
		return c, nil
	case <-l.done:
		return nil, errors.New("listener closed")
	}
}

func (l *fakeListener) close() error { l.once.Do(func() { close(l.done) }); return nil }

var errClosed = errors.New("closed")

// testConfig accepts from l and logs to log; each handshake waits for
// its connection's release.
func testConfig(l *fakeListener, log io.Writer) Config[*fakeConn] {
	return Config[*fakeConn]{
		Accept: l.accept, Close: l.close, Closed: func() error { return errClosed },
		Handshake: func(c *fakeConn) (kernel.Conn, error) {
			if err := <-c.release; err != nil {
				return nil, err
			}
			return readyConn{from: c}, nil
		},
		Log:  slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Name: "test", Addr: "here", Failure: "handshake failed",
	}
}

// start starts an acceptor on cfg and closes it when t ends.
func start(t *testing.T, cfg Config[*fakeConn]) *Acceptor[*fakeConn] {
	t.Helper()
	a := Start(cfg)
	t.Cleanup(func() { a.Close() })
	return a
}

func accept(t *testing.T, a *Acceptor[*fakeConn]) *fakeConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := a.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	return c.(readyConn).from
}

// A client stalled in its handshake holds up nobody: the one after it is
// accepted first.
func TestStalledHandshakeHoldsUpNobody(t *testing.T) {
	l := newFakeListener()
	a := start(t, testConfig(l, io.Discard))
	stalled := &fakeConn{name: "stalled", release: make(chan error)}
	quick := handshaken("quick", nil)
	l.incoming <- stalled
	l.incoming <- quick
	if got := accept(t, a); got != quick {
		t.Fatalf("accepted %s; want quick, whose handshake finished", got.name)
	}
	stalled.release <- nil
	if got := accept(t, a); got != stalled {
		t.Fatalf("accepted %s; want stalled, once its handshake finished", got.name)
	}
}

// A failed handshake closes its connection and is logged, at WARN unless
// the peer hung up, which is routine (a dial its caller gave up, a health
// check) and logged at DEBUG; Accept goes on to the next one.
func TestFailedHandshakeIsClosedAndLogged(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, tc := range []struct {
		name  string
		err   error
		level string
	}{
		{"refused", errors.New("bad certificate"), "level=WARN"},
		{"stalled", fmt.Errorf("reading its hello: %w", os.ErrDeadlineExceeded), "level=WARN"},
		{"hung up", fmt.Errorf("reading its hello: %w", io.EOF), "level=DEBUG"},
		{"hung up mid-record", io.ErrUnexpectedEOF, "level=DEBUG"},
		{"reset", reset, "level=DEBUG"},
		{"broken pipe", fmt.Errorf("sending welcome: %w", syscall.EPIPE), "level=DEBUG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newFakeListener()
			var log syncbuf.Buffer
			a := start(t, testConfig(l, &log))
			bad := handshaken("bad", tc.err)
			good := handshaken("good", nil)
			l.incoming <- bad
			l.incoming <- good
			if got := accept(t, a); got != good {
				t.Fatalf("accepted %s; want good", got.name)
			}
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log.String(), "handshake failed") && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if !bad.closed.Load() {
				t.Errorf("the connection whose handshake failed was not closed")
			}
			for _, want := range []string{tc.level, "test: handshake failed", "listener=here", tc.err.Error()} {
				if !strings.Contains(log.String(), want) {
					t.Errorf("log %q; want it to contain %q", log.String(), want)
				}
			}
		})
	}
}

// Close ends the handshakes in progress, fails Accept with Config.Closed's
// error, closes the listener and returns once every goroutine has ended
// (goleak checks).
func TestCloseEndsHandshakesAndAccept(t *testing.T) {
	l := newFakeListener()
	cfg := testConfig(l, io.Discard)
	cfg.Handshake = func(c *fakeConn) (kernel.Conn, error) {
		// A stalled handshake ends when Close closes its connection.
		for !c.closed.Load() {
			time.Sleep(time.Millisecond)
		}
		return nil, errors.New("connection closed")
	}
	a := Start(cfg)
	stalled := &fakeConn{name: "stalled"}
	l.incoming <- stalled
	accepted := make(chan error, 1)
	go func() {
		_, err := a.Accept(context.Background())
		accepted <- err
	}()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	if err := <-accepted; !errors.Is(err, errClosed) {
		t.Errorf("Accept after Close: %v; want Config.Closed's error", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v; want the listener's nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if !stalled.closed.Load() {
		t.Errorf("Close left the handshake in progress open")
	}
	select {
	case <-l.done:
	default:
		t.Errorf("Close did not close the listener")
	}
}

// Accept honours its ctx.
func TestAcceptEndsWithItsContext(t *testing.T) {
	a := start(t, testConfig(newFakeListener(), io.Discard))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := a.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accept with a 20ms ctx and nobody connecting: %v; want DeadlineExceeded", err)
	}
}

// An accept that fails (out of file descriptors, say) is logged and
// retried after a backoff, and the connections that come after are
// still accepted.
func TestFailingAcceptIsRetried(t *testing.T) {
	var fails atomic.Int32
	l := newFakeListener()
	failing := func() (*fakeConn, error) {
		if fails.Add(1) <= 3 {
			return nil, errors.New("too many open files")
		}
		return l.accept()
	}
	var log syncbuf.Buffer
	cfg := testConfig(l, &log)
	cfg.Accept = failing
	a := start(t, cfg)
	c := handshaken("after", nil)
	l.incoming <- c
	if got := accept(t, a); got != c {
		t.Fatalf("accepted %s; want the connection that came after the failures", got.name)
	}
	if n := strings.Count(log.String(), "test: accept failed; retrying"); n != 3 {
		t.Errorf("%d warnings for 3 failed accepts; want 3:\n%s", n, log.String())
	}
}
