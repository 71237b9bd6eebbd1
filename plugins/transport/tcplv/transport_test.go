package tcplv

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/internal/testpki"
	"github.com/kernrpc/kernrpc/kernel"
)

func TestOptionErrorsNameTheOption(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	missing := filepath.Join(dir, "missing.pem")
	cases := []struct {
		name   string
		mutate func(*Options)
		want   []string
	}{
		{"max_frame_size below the fixed header", func(o *Options) { o.MaxFrameSize = 8 }, []string{`"max_frame_size"`, "between 16"}},
		{"max_frame_size over 32 bits", func(o *Options) { o.MaxFrameSize = 1 << 32 }, []string{`"max_frame_size"`}},
		{"keepalive_interval zero", func(o *Options) { o.KeepaliveInterval = 0 }, []string{`"keepalive_interval"`, "must be positive"}},
		{"keepalive_timeout negative", func(o *Options) { o.KeepaliveTimeout = -1 }, []string{`"keepalive_timeout"`, "must be positive"}},
		{"write_timeout zero", func(o *Options) { o.WriteTimeout = 0 }, []string{`"write_timeout"`, "must be positive"}},
		{"write_timeout 1ns", func(o *Options) { o.WriteTimeout = 1 }, []string{`"write_timeout"`, "must be at least 1ms, got 1ns"}},
		{"write_timeout over 100 years", func(o *Options) { o.WriteTimeout = kernel.Duration(200 * 365 * 24 * time.Hour) }, []string{`"write_timeout"`, "at most 876000h0m0s (100 years), got 1752000h0m0s"}},
		{"keepalive_timeout over 100 years", func(o *Options) { o.KeepaliveTimeout = kernel.Duration(1<<63 - 1) }, []string{`"keepalive_timeout"`, "at most 876000h0m0s"}},
		{"keepalive_interval under 1ms", func(o *Options) { o.KeepaliveInterval = kernel.Duration(999 * time.Microsecond) }, []string{`"keepalive_interval"`, "at least 1ms, got 999µs"}},
		{"read_buffer_size tiny", func(o *Options) { o.ReadBufferSize = 4 }, []string{`"read_buffer_size"`}},
		{"key without certificate", func(o *Options) { o.TLS = &TLSOptions{KeyFile: missing} }, []string{`"tls.cert_file"`}},
		{"certificate without key", func(o *Options) { o.TLS = &TLSOptions{CertFile: missing} }, []string{`"tls.key_file"`}},
		{"client cert required without client CAs", func(o *Options) { o.TLS = &TLSOptions{RequireClientCert: true} }, []string{`"tls.client_ca_file"`}},
		{"certificate file missing", func(o *Options) { o.TLS = &TLSOptions{CertFile: missing, KeyFile: notPEM} }, []string{`"tls.cert_file"`, "missing.pem"}},
		{"ca_file without certificates", func(o *Options) { o.TLS = &TLSOptions{CAFile: notPEM} }, []string{`"tls.ca_file"`, "not.pem"}},
		{"client_ca_file missing", func(o *Options) { o.TLS = &TLSOptions{ClientCAFile: missing} }, []string{`"tls.client_ca_file"`, "missing.pem"}},
		{"key file missing", func(o *Options) { o.TLS = &TLSOptions{CertFile: notPEM, KeyFile: missing} }, []string{`"tls.key_file"`, "missing.pem"}},
		{"certificate and key that do not parse", func(o *Options) { o.TLS = &TLSOptions{CertFile: notPEM, KeyFile: notPEM} }, []string{`"tls.cert_file"`, "certificate " + notPEM + " with key " + notPEM}},
		{"min_ping_interval negative", func(o *Options) { o.MinPingInterval = -1 }, []string{`"min_ping_interval"`, "must not be negative"}},
		{"min_ping_interval under 1ms", func(o *Options) { o.MinPingInterval = kernel.Duration(500 * time.Microsecond) }, []string{`"min_ping_interval"`, "at least 1ms, got 500µs"}},
		{"max_metadata_entries zero", func(o *Options) { o.MaxMetadataEntries = 0 }, []string{`"max_metadata_entries"`, "at least 1, got 0"}},
		{"max_metadata_bytes zero", func(o *Options) { o.MaxMetadataBytes = 0 }, []string{`"max_metadata_bytes"`, "at least 1 byte, got 0"}},
		{"max_write_queue under two frames", func(o *Options) { o.MaxWriteQueue = o.MaxFrameSize }, []string{`"max_write_queue"`, "at least twice max_frame_size"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.mutate(o)
			_, err := New(o)
			if err == nil {
				t.Fatal("New accepted bad options")
			}
			for _, w := range append(tc.want, "tcp-lv: option ") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigOptionsReachTheTransport(t *testing.T) {
	tr, err := kernel.NewTransport(Name, map[string]any{"max_frame_size": "1MiB", "keepalive_interval": "2s", "write_timeout": "1m"}, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := tr.(*transport)
	if got.maxFrame != 1<<20 || got.keepaliveInterval != 2*time.Second || got.keepaliveTimeout != 5*time.Second || got.writeTimeout != time.Minute {
		t.Fatalf("transport built from config: %+v", got)
	}
	if caps, ok := tr.(kernel.TransportCapabilities); !ok || !caps.LendsMemory() {
		t.Fatal("tcp-lv must declare that it lends memory")
	}
	_, err = kernel.NewTransport(Name, map[string]any{"keepalive_timeout": "0s"}, "test.yaml")
	if err == nil || !strings.Contains(err.Error(), `"keepalive_timeout"`) || !strings.Contains(err.Error(), "test.yaml") {
		t.Fatalf("bad option from config: %v", err)
	}
}

// TestPackageDocListsEveryOption keeps the doc comment in step with the
// options structs.
func TestPackageDocListsEveryOption(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[Options](), reflect.TypeFor[TLSOptions]()} {
		for f := range typ.Fields() {
			key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if key != "-" && !strings.Contains(string(doc), key) {
				t.Errorf("doc.go does not describe option %q", key)
			}
		}
	}
}

func TestListenerAddrIsDialableAndCloseEndsAccept(t *testing.T) {
	tr := newTransport(t, testOptions())
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(ln.Addr(), ":0") {
		t.Fatalf("Addr %q does not have the chosen port", ln.Addr())
	}
	if _, err := ln.Accept(timeout(t, 20*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept with an expiring ctx: %v", err)
	}
	// The interrupted Accept left the listener usable.
	c := dial(t, tr, ln.Addr())
	s, err := ln.Accept(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s.RemoteAddr() != c.LocalAddr() || s.LocalAddr() != c.RemoteAddr() {
		t.Fatalf("addresses: server %s→%s, client %s→%s", s.LocalAddr(), s.RemoteAddr(), c.LocalAddr(), c.RemoteAddr())
	}
	pending := make(chan error, 1)
	go func() {
		_, err := ln.Accept(context.Background())
		pending <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-pending:
		if !errors.Is(err, kernel.ErrClosed) {
			t.Fatalf("pending Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a pending Accept")
	}
	if _, err := ln.Accept(context.Background()); !errors.Is(err, kernel.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Connections accepted before stay open.
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest}); err != nil {
		t.Fatal(err)
	}
	f, err := s.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("accepted connection after listener Close: %v", err)
	}
	f.Release()
	s.Close()
}

func TestDialingAClosedPortFailsPromptlyNamingTheAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err = newTransport(t, testOptions()).Dial(timeout(t, 5*time.Second), addr)
	if err == nil || !strings.Contains(err.Error(), "tcp-lv: dial tcp "+addr) {
		t.Fatalf("Dial to a closed port: %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Dial took %v to fail", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newTransport(t, testOptions()).Dial(ctx, addr); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with a cancelled ctx: %v", err)
	}
}

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files.
type testPKI struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	ca := testpki.New(t, "test CA")
	p := testPKI{caFile: ca.File}
	p.serverCert, p.serverKey = ca.Issue(t, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = ca.Issue(t, "client", x509.ExtKeyUsageClientAuth)
	return p
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	serverOpts := testOptions()
	serverOpts.TLS = &TLSOptions{CertFile: pki.serverCert, KeyFile: pki.serverKey, ClientCAFile: pki.caFile, RequireClientCert: true}
	var logs syncbuf.Buffer
	serverOpts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ln := listen(t, newTransport(t, serverOpts))
	// logged waits for a handshake failure logged since mark and returns
	// the log from mark on.
	logged := func(t *testing.T, mark int) string {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if out := logs.String()[mark:]; strings.Contains(out, "TLS handshake failed") {
				return out
			}
		}
		t.Fatalf("no handshake failure logged; the log since the subtest began: %q", logs.String()[mark:])
		return ""
	}

	// pair dials ln with a client certificate.
	pair := func(t *testing.T) (client, server *conn) {
		o := testOptions()
		o.TLS = &TLSOptions{CAFile: pki.caFile, CertFile: pki.clientCert, KeyFile: pki.clientKey}
		accepted := make(chan kernel.Conn, 1)
		go func() {
			s, _ := ln.Accept(timeout(t, 5*time.Second))
			accepted <- s
		}()
		client = dial(t, newTransport(t, o), ln.Addr())
		server = connOf(<-accepted)
		if server == nil {
			t.Fatal("Accept failed")
		}
		t.Cleanup(func() { server.Close() })
		return client, server
	}

	t.Run("round trip with a client certificate", func(t *testing.T) {
		c, s := pair(t)
		payload := pattern(100<<10, 5)
		if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 4, Payload: append([]byte(nil), payload...)}); err != nil {
			t.Fatal(err)
		}
		f, err := s.ReadFrame(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if f.CallID != 4 || string(f.Payload) != string(payload) {
			t.Fatalf("got call %d with %d bytes", f.CallID, len(f.Payload))
		}
		f.Release()
		if err := s.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 4}); err != nil {
			t.Fatal(err)
		}
		if f, err = c.ReadFrame(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		f.Release()
	})

	t.Run("an interrupted read resumes inside a TLS record stream", func(t *testing.T) {
		c, s := pair(t)
		wire := encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 11, Payload: pattern(50<<10, 2)})
		// Write through the client's TLS layer, a piece at a time.
		c.nc.Write(wire[:20<<10])
		if _, err := s.ReadFrame(timeout(t, 30*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("interrupted ReadFrame: %v", err)
		}
		c.nc.Write(wire[20<<10:])
		f, err := s.ReadFrame(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if f.CallID != 11 || string(f.Payload) != string(wire[len(wire)-50<<10:]) {
			t.Fatalf("resumed frame: call %d with %d bytes", f.CallID, len(f.Payload))
		}
		f.Release()
	})

	t.Run("half-close delivers the last frame, then EOF", func(t *testing.T) {
		c, s := pair(t)
		if err := s.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway}); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		f, err := c.ReadFrame(timeout(t, 5*time.Second))
		if err != nil || f.Type != kernel.FrameGoAway {
			t.Fatalf("got %v %v, want the GoAway", f, err)
		}
		f.Release()
		if _, err := c.ReadFrame(timeout(t, 5*time.Second)); !errors.Is(err, kernel.ErrPeerGone) {
			t.Fatalf("after the GoAway: %v, want peer gone", err)
		}
	})

	t.Run("a client without a certificate is refused", func(t *testing.T) {
		mark := len(logs.String())
		o := testOptions()
		o.TLS = &TLSOptions{CAFile: pki.caFile}
		acceptCtx, cancelAccept := context.WithCancel(context.Background())
		accepted := make(chan error, 1)
		go func() {
			s, err := ln.Accept(acceptCtx)
			if err == nil {
				s.Close()
				err = errors.New("the server accepted a client without a certificate")
			}
			accepted <- err
		}()
		defer func() {
			cancelAccept()
			if err := <-accepted; !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
		// With TLS 1.3 the client finishes its side of the handshake before
		// the server checks its certificate: the refusal may come on Dial or
		// on the first read.
		c, err := newTransport(t, o).Dial(timeout(t, 5*time.Second), ln.Addr())
		if err == nil {
			defer c.Close()
			_, err = c.ReadFrame(timeout(t, 5*time.Second))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("client without a certificate: %v, want a refusal naming the certificate", err)
		}
		if out := logged(t, mark); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "certificate") {
			t.Errorf("log %q; want the refusal at WARN, naming the certificate", out)
		}
	})

	// A client whose dial its caller gave up, or a TCP health check, hangs
	// up before the handshake ends: routine, so DEBUG, not a WARN each.
	t.Run("a client that hangs up in its handshake is logged at DEBUG", func(t *testing.T) {
		mark := len(logs.String())
		raw, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		raw.Close()
		if out := logged(t, mark); strings.Contains(out, "level=WARN") || !strings.Contains(out, "level=DEBUG") || !strings.Contains(out, "EOF") {
			t.Errorf("log %q; want the hang-up at DEBUG, saying EOF, and no WARN", out)
		}
	})

	t.Run("a client that does not trust the server's CA gives up", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		acceptDone := make(chan struct{})
		go func() {
			defer close(acceptDone)
			if s, err := ln.Accept(ctx); err == nil {
				s.Close()
			}
		}()
		// This Accept must not outlive the subtest and take the next one's
		// connection.
		defer func() { cancel(); <-acceptDone }()
		o := testOptions()
		o.TLS = &TLSOptions{} // trusts the system roots only
		_, err := newTransport(t, o).Dial(timeout(t, 5*time.Second), ln.Addr())
		if err == nil || !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("Dial: %v, want a TLS handshake failure", err)
		}
	})

	t.Run("a client that never finishes its handshake holds up nobody", func(t *testing.T) {
		// Connects and says nothing: its handshake waits out its timeout
		// (keepalive interval + timeout, 15s by default) on its own goroutine.
		stalled, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer stalled.Close()
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		c, s := pair(t)
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("a good client waited %v behind a stalled handshake", el)
		}
		if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1}); err != nil {
			t.Fatal(err)
		}
		f, err := s.ReadFrame(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		f.Release()
	})

	t.Run("listening with TLS needs a certificate", func(t *testing.T) {
		o := testOptions()
		o.TLS = &TLSOptions{CAFile: pki.caFile}
		_, err := newTransport(t, o).Listen(context.Background(), "127.0.0.1:0")
		if err == nil || !strings.Contains(err.Error(), `"tls.cert_file"`) {
			t.Fatalf("Listen: %v", err)
		}
	})
}

// The longest timeout validate accepts works: a long write_timeout, taken
// to mean "never", must not overflow into a deadline in the past that
// fails every write, nor keepalive's two periods into a negative TLS
// handshake timeout.
func TestTheLongestTimeoutsAllowedWork(t *testing.T) {
	o := testOptions()
	o.WriteTimeout = kernel.Duration(maxTimeout)
	o.KeepaliveInterval = kernel.Duration(maxTimeout)
	o.KeepaliveTimeout = kernel.Duration(maxTimeout)
	o.FrameTimeout = kernel.Duration(maxTimeout)
	o.FirstFrameTimeout = kernel.Duration(maxTimeout)
	tr := newTransport(t, o)
	if d := tr.handshakeTimeout(); d <= 0 {
		t.Fatalf("TLS handshake timeout %s", d)
	}
	client, server := connPair(t, o)
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Payload: pattern(100, 1)}); err != nil {
		t.Fatalf("WriteFrame with write_timeout %s: %v", o.WriteTimeout, err)
	}
	f, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if f, err = client.ReadFrame(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.Release()
}
