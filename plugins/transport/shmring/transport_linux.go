package shmring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kernrpc/kernrpc/internal/acceptor"
	"github.com/kernrpc/kernrpc/kernel"
)

var (
	_ kernel.Transport             = (*transport)(nil)
	_ kernel.TransportCapabilities = (*transport)(nil)
	_ kernel.Listener              = (*listener)(nil)
)

// transport holds validated options; listeners and connections it makes
// are their callers' to close.
type transport struct {
	ringSize    int
	maxFrame    int
	spin        time.Duration
	waitTimeout time.Duration
	limits      kernel.FrameLimits
	// writerRecheck bounds each park of a writer waiting for room.
	writerRecheck time.Duration
	// allowUIDs holds this process's effective uid first: SO_PEERCRED
	// reports a peer's effective uid, which is who a process acts as.
	allowUIDs []uint32
	log       *slog.Logger
}

// New builds an shm-ring transport from o (nil means DefaultOptions),
// naming the bad option when one is invalid.
func New(o *Options) (kernel.Transport, error) {
	if o == nil {
		o = DefaultOptions()
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	t := &transport{
		ringSize:      int(o.RingSize),
		maxFrame:      int(o.MaxFrameSize),
		spin:          o.Spin.D(),
		waitTimeout:   o.WaitTimeout.D(),
		limits:        kernel.FrameLimits{MaxMetadataEntries: o.MaxMetadataEntries, MaxMetadataBytes: int(o.MaxMetadataBytes)},
		writerRecheck: writerRecheck,
		allowUIDs:     append([]uint32{uint32(os.Geteuid())}, o.AllowUIDs...),
		log:           o.Logger,
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	return t, nil
}

// LendsMemory is true: Buffer lends ring space and read payloads live in
// the ring until released.
func (t *transport) LendsMemory() bool { return true }

func (t *transport) allowed(uid uint32) bool { return slices.Contains(t.allowUIDs, uid) }

// socketPath turns an address into the Unix socket path to listen on or
// dial: "/path/x.sock", "shm-ring:///path/x.sock", or "@name" for an
// abstract socket (Linux), which leaves no file behind. auto is set for a
// host:port address with port 0, the kernel's default address: like TCP's
// port 0, it asks the listener for a fresh name.
func socketPath(addr string) (path string, auto bool, err error) {
	p := strings.TrimPrefix(addr, "shm-ring://")
	if p == "" {
		return "", false, fmt.Errorf("shm-ring: empty address: give a Unix socket path such as /run/kernrpc/echo.sock")
	}
	// An abstract name ("@...") may contain a colon: it is never host:port.
	if _, port, err := net.SplitHostPort(p); err == nil && !strings.Contains(p, "/") && !strings.HasPrefix(p, "@") {
		if port == "0" {
			return "", true, nil
		}
		return "", false, fmt.Errorf("shm-ring: address %q is host:port, but shm-ring listens on a Unix socket path such as /run/kernrpc/echo.sock (or port 0 for a fresh abstract name)", addr)
	}
	return p, false, nil
}

// Listen listens on the Unix socket at addr. A socket file left by a
// process that died is replaced; one a live server listens on is not,
// even one bound by a Listen running at the same time (see lockDir).
func (t *transport) Listen(ctx context.Context, addr string) (kernel.Listener, error) {
	path, auto, err := socketPath(addr)
	if err != nil {
		return nil, err
	}
	if auto {
		path = fmt.Sprintf("@kernrpc-shm-ring-%d-%016x", os.Getpid(), rand.Uint64())
	} else if !strings.HasPrefix(path, "@") {
		// Finding the file stale, removing it and binding anew must not
		// interleave with another server's: it could remove the socket this
		// one just bound, as stale, and both would listen, one unreachable.
		unlock, err := lockDir(ctx, filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("shm-ring: listen on %s: %w", path, err)
		}
		defer unlock()
		if err := removeStaleSocket(ctx, path); err != nil {
			return nil, err
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("shm-ring: listen on %s: %w", path, err)
	}
	l := &listener{t: t, ln: ln.(*net.UnixListener), addr: path}
	l.shaker = acceptor.Start(acceptor.Config[*net.UnixConn]{
		Accept: l.ln.AcceptUnix, Close: l.ln.Close, Handshake: l.attach,
		Closed: func() error { return fmt.Errorf("shm-ring: listener %s: %w", path, kernel.ErrClosed) },
		Log:    t.log, Name: "shm-ring", Addr: path, Failure: "client not attached",
	})
	return l, nil
}

// lockDir takes an exclusive flock on dir, which every shm-ring Listen on
// a path in dir takes while it replaces a stale socket file and binds, and
// returns its release. A directory this process cannot open is not locked.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return func() {}, nil // Listen says what is wrong with the path
	}
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return func() {}, nil // a file system without flock: unlocked, as before
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, fmt.Errorf("waiting for another server's Listen in %s: %w", dir, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// removeStaleSocket removes the socket file at path if nobody listens on
// it any more (its server was killed, say), so that a restarted server
// does not fail with "address already in use".
func removeStaleSocket(ctx context.Context, path string) error {
	if strings.HasPrefix(path, "@") {
		return nil
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return nil // absent, or not a socket: Listen says what is wrong
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("shm-ring: listen on %s: another server is listening there", path)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("shm-ring: listen on %s: remove the stale socket left by a dead server: %w", path, err)
		}
	}
	return nil
}

// Dial connects to the listener at addr and attaches: it receives the
// segment and maps it, all within ctx's deadline.
func (t *transport) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	path, auto, err := socketPath(addr)
	if err == nil && auto {
		err = fmt.Errorf("shm-ring: cannot dial %q: port 0 names no listener; dial the address the listener reports", addr)
	}
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("shm-ring: dial %s: %w", path, err)
	}
	uc := nc.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(aLongTimeAgo) })
	c, err := t.attachClient(uc, path)
	if !stop() || err != nil {
		uc.Close()
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		if c != nil {
			// No end record: with nothing in its ring to read, the server's
			// end sees the socket close and frees the segment at once,
			// rather than holding it for an Accept that would only read the
			// end.
			c.abandon()
		}
		return nil, fmt.Errorf("shm-ring: dial %s: %w", path, err)
	}
	return c, nil
}

// aLongTimeAgo is a deadline in the past: it wakes a blocked call at once.
var aLongTimeAgo = time.Unix(1, 0)

// listener accepts sockets on a goroutine of its own and attaches each
// client on another, so that a client that stalls in its handshake holds
// up nobody; Accept takes attached connections from the shaker.
type listener struct {
	t         *transport
	ln        *net.UnixListener
	addr      string
	shaker    *acceptor.Acceptor[*net.UnixConn]
	closeOnce sync.Once
}

// Accept waits for the next attached client.
func (l *listener) Accept(ctx context.Context) (kernel.Conn, error) {
	return l.shaker.Accept(ctx)
}

// attach runs one server handshake.
func (l *listener) attach(uc *net.UnixConn) (kernel.Conn, error) {
	uc.SetDeadline(time.Now().Add(l.t.waitTimeout))
	return l.t.attachServer(uc, l.addr)
}

// Addr is the socket path clients dial.
func (l *listener) Addr() string { return l.addr }

// Close stops accepting and removes the socket file; attached connections
// stay. It is idempotent.
func (l *listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		if err = l.shaker.Close(); err != nil {
			err = fmt.Errorf("shm-ring: close listener %s: %w", l.addr, err)
		}
	})
	return err
}
