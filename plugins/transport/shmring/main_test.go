//go:build linux

package shmring

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

func TestMain(m *testing.M) {
	if helper := os.Getenv(helperEnv); helper != "" {
		runHelper(helper)
		return
	}
	// The kernel's informational logs (serving, draining) drown the tests'.
	slog.SetLogLoggerLevel(slog.LevelWarn)
	goleak.VerifyTestMain(m)
}

// testOptions are the defaults with a silent logger and small rings, so
// that tests fill them quickly and 32 clients map little memory.
func testOptions() *Options {
	o := DefaultOptions()
	o.RingSize = 64 << 10
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

func newTransport(tb testing.TB, o *Options) *transport {
	tb.Helper()
	tr, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return tr.(*transport)
}

// socketIn returns a socket path in a fresh short directory: t.TempDir's
// paths can exceed what a Unix socket path may hold.
func socketIn(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "shm")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

func listen(tb testing.TB, tr kernel.Transport) kernel.Listener {
	tb.Helper()
	ln, err := tr.Listen(context.Background(), socketIn(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

func timeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// connect dials ln and accepts the connection.
func connect(tb testing.TB, tr kernel.Transport, ln kernel.Listener) (client, server *conn) {
	tb.Helper()
	return connectWithin(tb, tr, ln, timeout(tb, 10*time.Second))
}

// connectWithin is connect with the dial's context.
func connectWithin(tb testing.TB, tr kernel.Transport, ln kernel.Listener, dial context.Context) (client, server *conn) {
	tb.Helper()
	accepted := make(chan kernel.Conn, 1)
	go func() {
		c, _ := ln.Accept(timeout(tb, 10*time.Second))
		accepted <- c
	}()
	c, err := tr.Dial(dial, ln.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	s := <-accepted
	if s == nil {
		tb.Fatal("Accept failed")
	}
	tb.Cleanup(func() { s.Close() })
	return c.(*conn), s.(*conn)
}

// connPair returns both ends of a fresh connection.
func connPair(tb testing.TB, o *Options) (client, server *conn) {
	tb.Helper()
	tr := newTransport(tb, o)
	return connect(tb, tr, listen(tb, tr))
}

// pattern returns n bytes that differ from frame to frame.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// send writes a frame whose payload is encoded into a buffer from Buffer,
// as the kernel does it.
func send(tb testing.TB, c kernel.Conn, f *kernel.Frame, payload []byte) {
	tb.Helper()
	f.Payload = append(c.Buffer(len(payload)), payload...)
	if err := c.WriteFrame(f); err != nil {
		tb.Fatalf("WriteFrame of %d bytes: %v", len(payload), err)
	}
}

func recv(tb testing.TB, c kernel.Conn) *kernel.Frame {
	tb.Helper()
	f, err := c.ReadFrame(timeout(tb, 10*time.Second))
	if err != nil {
		tb.Fatalf("ReadFrame: %v", err)
	}
	return f
}
