// Package acceptor is the accepting side of a transport whose connections
// need a handshake before Accept may hand them out (tcp-lv with TLS,
// shm-ring): one goroutine accepts, and each handshake runs on a goroutine
// of its own, so that a client that connects and stalls in its handshake
// holds up nobody else. Accept takes the connections whose handshake
// succeeded.
package acceptor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Conn is what a listener's accept returns: *net.TCPConn, *net.UnixConn.
type Conn interface {
	comparable
	Close() error
}

// Config says how to accept a listener's connections and ready them.
type Config[C Conn] struct {
	// Accept is the listener's blocking accept; it fails for good once
	// Close has closed the listener.
	Accept func() (C, error)
	// Close closes the listener; Closed is the error Accept returns once
	// the acceptor is closed.
	Close  func() error
	Closed func() error
	// Handshake readies an accepted connection. When it fails, the
	// acceptor closes c and logs the error under Failure: at WARN, or at
	// DEBUG when the peer hung up (see peerLeft).
	Handshake func(c C) (kernel.Conn, error)
	Log       *slog.Logger
	// Name prefixes the log messages ("tcp-lv"); Addr is the listener's,
	// given with each; Failure is the message of a failed handshake.
	Name, Addr, Failure string
}

// Acceptor runs one listener's accept loop and handshakes.
type Acceptor[C Conn] struct {
	cfg    Config[C]
	ready  chan kernel.Conn
	closed chan struct{}

	mu      sync.Mutex
	shaking map[C]struct{} // handshakes in progress, closed by Stop
	loops   sync.WaitGroup // the accept loop and the handshakes
}

// Start starts accepting.
func Start[C Conn](cfg Config[C]) *Acceptor[C] {
	a := &Acceptor[C]{cfg: cfg, ready: make(chan kernel.Conn), closed: make(chan struct{}), shaking: make(map[C]struct{})}
	a.loops.Add(1)
	go a.acceptLoop()
	return a
}

// Accept waits for the next connection whose handshake succeeded. It
// returns ctx's error when ctx ends first, and Config.Closed's once the
// acceptor is closed.
func (a *Acceptor[C]) Accept(ctx context.Context) (kernel.Conn, error) {
	select {
	case c := <-a.ready:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.closed:
		return nil, a.cfg.Closed()
	}
}

// Close ends the handshakes in progress, makes Accept fail, closes the
// listener (returning its error) and waits for the accept loop and the
// handshakes to end. Call it once.
func (a *Acceptor[C]) Close() error {
	a.mu.Lock()
	close(a.closed)
	for c := range a.shaking {
		c.Close()
	}
	a.mu.Unlock()
	err := a.cfg.Close()
	a.loops.Wait()
	return err
}

// acceptLoop accepts until Stop, backing off while accept fails (out of
// file descriptors, say) rather than spinning.
func (a *Acceptor[C]) acceptLoop() {
	defer a.loops.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := a.cfg.Accept()
		if err != nil {
			if a.stopped() {
				return
			}
			a.cfg.Log.Warn(a.cfg.Name+": accept failed; retrying", "listener", a.cfg.Addr, "err", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-a.closed:
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		a.mu.Lock()
		if a.stopped() {
			a.mu.Unlock()
			c.Close()
			return
		}
		a.shaking[c] = struct{}{}
		a.loops.Add(1)
		a.mu.Unlock()
		go a.shake(c)
	}
}

// shake runs one handshake and hands the connection to Accept.
func (a *Acceptor[C]) shake(c C) {
	defer a.loops.Done()
	conn, err := a.cfg.Handshake(c)
	a.mu.Lock()
	delete(a.shaking, c)
	a.mu.Unlock()
	if err != nil {
		c.Close()
		if !a.stopped() {
			level := slog.LevelWarn
			if peerLeft(err) {
				level = slog.LevelDebug
			}
			a.cfg.Log.Log(context.Background(), level, a.cfg.Name+": "+a.cfg.Failure, "listener", a.cfg.Addr, "err", err)
		}
		return
	}
	select {
	case a.ready <- conn:
	case <-a.closed:
		conn.Close()
	}
}

// peerLeft reports whether a handshake failed because the peer hung up:
// a client whose dial was cancelled by its caller's deadline, one closed
// while it dialled, a TCP health check. Those are routine and say nothing
// about this side, so they are logged at DEBUG; a WARN for each would
// bury the refusals that matter (a bad hello, a certificate, a stall).
func peerLeft(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (a *Acceptor[C]) stopped() bool {
	select {
	case <-a.closed:
		return true
	default:
		return false
	}
}
