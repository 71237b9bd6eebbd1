package tcplv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/internal/acceptor"
	"github.com/kernrpc/kernrpc/internal/bufpool"
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
	maxFrame          int
	keepaliveInterval time.Duration
	keepaliveTimeout  time.Duration
	writeTimeout      time.Duration
	readBufferSize    int
	limits            kernel.FrameLimits
	frameTimeout      time.Duration
	firstFrameTimeout time.Duration
	maxWriteQueue     int
	minPingInterval   time.Duration
	log               *slog.Logger
	tlsOn             bool
	serverTLS         *tls.Config // nil without a certificate
	clientTLS         *tls.Config
	osKeepalive       net.KeepAliveConfig
	buffers           *bufpool.Pool // large buffers, shared by the connections (see ownMax)
}

// New builds a tcp-lv transport from o (nil means DefaultOptions). It
// validates every option and loads the TLS files, naming the bad option.
func New(o *Options) (kernel.Transport, error) {
	if o == nil {
		o = DefaultOptions()
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	t := &transport{
		buffers:           bufpool.New(sharedLimits),
		maxFrame:          int(o.MaxFrameSize),
		keepaliveInterval: o.KeepaliveInterval.D(),
		keepaliveTimeout:  o.KeepaliveTimeout.D(),
		writeTimeout:      o.WriteTimeout.D(),
		readBufferSize:    int(o.ReadBufferSize),
		limits:            kernel.FrameLimits{MaxMetadataEntries: o.MaxMetadataEntries, MaxMetadataBytes: int(o.MaxMetadataBytes)},
		frameTimeout:      o.FrameTimeout.D(),
		firstFrameTimeout: o.FirstFrameTimeout.D(),
		maxWriteQueue:     o.maxWriteQueue(),
		minPingInterval:   o.minPingInterval(),
		log:               o.Logger,
		osKeepalive: net.KeepAliveConfig{
			Enable:   true,
			Idle:     min(o.KeepaliveInterval.D(), maxOSKeepalive),
			Interval: min(o.KeepaliveInterval.D(), maxOSKeepalive),
			// The system's probe count (9 unless an operator changed
			// it), which net would otherwise set to 9 with a syscall on
			// every connection: a short connection pays it on both sides.
			Count: -1,
		},
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	if o.TLS != nil {
		var err error
		if t.serverTLS, t.clientTLS, err = o.TLS.tlsConfigs(); err != nil {
			return nil, err
		}
		t.tlsOn = true
	}
	return t, nil
}

// LendsMemory is true: buffers and read payloads are pooled and reused.
func (t *transport) LendsMemory() bool { return true }

// handshakeTimeout bounds a TLS handshake: a peer silent for a keepalive
// period is as good as gone.
func (t *transport) handshakeTimeout() time.Duration {
	return t.keepaliveInterval + t.keepaliveTimeout
}

// Listen listens on addr (host:port; port 0 picks a free one).
func (t *transport) Listen(ctx context.Context, addr string) (kernel.Listener, error) {
	if t.tlsOn && t.serverTLS == nil {
		return nil, fmt.Errorf("tcp-lv: listen %s: option %q is required to serve TLS", addr, "tls.cert_file")
	}
	lc := net.ListenConfig{KeepAliveConfig: t.osKeepalive}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp-lv: %w", err) // net's error names the operation and address
	}
	l := &listener{
		t:      t,
		ln:     ln.(*net.TCPListener),
		addr:   ln.Addr().String(),
		turn:   make(chan struct{}, 1),
		closed: make(chan struct{}),
	}
	if t.tlsOn {
		l.shaker = acceptor.Start(acceptor.Config[*net.TCPConn]{
			Accept: l.ln.AcceptTCP, Close: l.ln.Close, Closed: l.closedError, Handshake: l.shake,
			Log: t.log, Name: "tcp-lv", Addr: l.addr, Failure: "TLS handshake failed; connection refused",
		})
	}
	return l, nil
}

// Dial connects to addr (host:port), completing the TLS handshake if
// configured, within ctx's deadline.
func (t *transport) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	d := net.Dialer{KeepAliveConfig: t.osKeepalive}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp-lv: %w", err) // net's error names the operation and address
	}
	tcp := nc.(*net.TCPConn)
	if !t.tlsOn {
		return t.startTCP(tcp, nil, false), nil
	}
	cfg := t.clientTLS
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		cfg = cfg.Clone()
		if cfg.ServerName, _, err = net.SplitHostPort(addr); err != nil {
			tcp.Close()
			return nil, fmt.Errorf("tcp-lv: dial %s: %w", addr, err)
		}
	}
	tc := tls.Client(tcp, cfg)
	if err := t.handshake(ctx, tcp, tc); err != nil {
		return nil, fmt.Errorf("tcp-lv: dial %s: TLS handshake: %w", addr, err)
	}
	return t.startTCP(tcp, tc, false), nil
}

// handshake runs the TLS handshake before the connection is handed out:
// done lazily inside ReadFrame, an interrupted handshake would poison the
// connection for good.
func (t *transport) handshake(ctx context.Context, tcp *net.TCPConn, tc *tls.Conn) error {
	tcp.SetDeadline(time.Now().Add(t.handshakeTimeout()))
	if err := tc.HandshakeContext(ctx); err != nil {
		tcp.Close()
		return err
	}
	tcp.SetDeadline(time.Time{})
	return nil
}

// startTCP starts a connection; accepted says this side listened. The
// net package turns Nagle off on every TCP connection it makes, so the
// small frames leave at once without a SetNoDelay syscall of ours.
func (t *transport) startTCP(tcp *net.TCPConn, tc *tls.Conn, accepted bool) kernel.Conn {
	if tc != nil {
		return newConn(t, tc, tcp, accepted)
	}
	c := newConn(t, tcp, tcp, accepted)
	if c.sock.ok() {
		return ctxConn{c}
	}
	return c
}

// listener accepts connections. Accept calls take turns so that the
// deadline one sets to honour its ctx never cuts another short.
type listener struct {
	t         *transport
	ln        *net.TCPListener
	addr      string
	turn      chan struct{} // capacity 1: held by the Accept in progress
	closeOnce sync.Once
	closed    chan struct{}

	// With TLS, a goroutine accepts and each handshake runs on its own
	// goroutine, so that a client that connects and never finishes its
	// handshake holds up nobody else; Accept takes finished ones from it.
	shaker *acceptor.Acceptor[*net.TCPConn]
}

// aLongTimeAgo is a deadline in the past: it wakes a blocked call at once.
var aLongTimeAgo = time.Unix(1, 0)

// Accept waits for the next connection; with TLS, for the next one whose
// handshake succeeded (a failed handshake is logged and skipped).
func (l *listener) Accept(ctx context.Context) (kernel.Conn, error) {
	if l.shaker != nil {
		return l.shaker.Accept(ctx)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closed:
		return nil, l.closedError()
	}
	defer func() { <-l.turn }()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { l.ln.SetDeadline(aLongTimeAgo) })
		defer stop()
	}
	for {
		tcp, err := l.ln.AcceptTCP()
		if err != nil {
			select {
			case <-l.closed:
				return nil, l.closedError()
			default:
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, fmt.Errorf("tcp-lv: accept on %s: %w", l.addr, err)
			}
			if err := ctx.Err(); err != nil {
				l.ln.SetDeadline(time.Time{})
				return nil, err
			}
			// A deadline left by an earlier Accept's ctx: clear it, then
			// check ctx again in case it fired in between.
			l.ln.SetDeadline(time.Time{})
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		return l.t.startTCP(tcp, nil, true), nil
	}
}

// shake runs one server TLS handshake.
func (l *listener) shake(tcp *net.TCPConn) (kernel.Conn, error) {
	tc := tls.Server(tcp, l.t.serverTLS)
	if err := l.t.handshake(context.Background(), tcp, tc); err != nil {
		return nil, fmt.Errorf("from %s: %w", tcp.RemoteAddr(), err)
	}
	return l.t.startTCP(tcp, tc, true), nil
}

func (l *listener) closedError() error {
	return fmt.Errorf("tcp-lv: listener %s: %w", l.addr, kernel.ErrClosed)
}

// Addr is the address clients dial, with the port the system chose.
func (l *listener) Addr() string { return l.addr }

// Close stops accepting; accepted connections stay open. It is idempotent.
func (l *listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closed)
		if l.shaker != nil {
			err = l.shaker.Close()
		} else {
			err = l.ln.Close()
		}
		if err != nil {
			err = fmt.Errorf("tcp-lv: close listener %s: %w", l.addr, err)
		}
	})
	return err
}
