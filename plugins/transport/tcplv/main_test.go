package tcplv

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

// echoPeerEnv makes the test binary an echo peer instead of running tests:
// benchmarks keep the peer in another process, as a real one would be.
const echoPeerEnv = "TCPLV_ECHO_PEER"

func TestMain(m *testing.M) {
	if os.Getenv(echoPeerEnv) != "" {
		runEchoPeer()
		return
	}
	goleak.VerifyTestMain(m)
}

// runEchoPeer prints its address, echoes every byte on every connection,
// and exits when its standard input closes (the test process is done).
func runEchoPeer() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	os.Stdout.WriteString(ln.Addr().String() + "\n")
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		go func() {
			buf := make([]byte, 256<<10)
			for {
				n, err := nc.Read(buf)
				if err != nil {
					nc.Close()
					return
				}
				if _, err := nc.Write(buf[:n]); err != nil {
					nc.Close()
					return
				}
			}
		}()
	}
}

// startEchoPeer runs an echo peer process and returns its address.
func startEchoPeer(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), echoPeerEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("echo peer printed no address: %v", err)
	}
	return strings.TrimSpace(line)
}

// testOptions are the defaults with a silent logger.
func testOptions() *Options {
	o := DefaultOptions()
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

func listen(tb testing.TB, tr kernel.Transport) kernel.Listener {
	tb.Helper()
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

func accept(tb testing.TB, ln kernel.Listener) *conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ln.Accept(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return connOf(c)
}

func dial(tb testing.TB, tr kernel.Transport, addr string) *conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tr.Dial(ctx, addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return connOf(c)
}

// connOf is the *conn behind a connection the transport made.
func connOf(c kernel.Conn) *conn {
	if cc, ok := c.(ctxConn); ok {
		return cc.conn
	}
	cc, _ := c.(*conn) // nil for nil
	return cc
}

// connPair returns both ends of a loopback tcp-lv connection.
func connPair(tb testing.TB, o *Options) (client, server *conn) {
	tb.Helper()
	tr := newTransport(tb, o)
	ln := listen(tb, tr)
	client = dial(tb, tr, ln.Addr())
	return client, accept(tb, ln)
}

// rawPair returns a plain socket dialed to a tcp-lv server connection, to
// send what a tcp-lv peer never would.
func rawPair(tb testing.TB, o *Options) (raw net.Conn, server *conn) {
	tb.Helper()
	ln := listen(tb, newTransport(tb, o))
	raw, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { raw.Close() })
	return raw, accept(tb, ln)
}

func timeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// encode returns f as it goes on the wire.
func encode(f *kernel.Frame) []byte {
	return append(kernel.AppendFrameHeader(nil, f), f.Payload...)
}

// pattern returns n bytes that differ from frame to frame.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}
