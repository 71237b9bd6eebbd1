//go:build linux

package tcplv

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// tcpPair returns both ends of a plain loopback TCP connection.
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func rawOf(t *testing.T, c net.Conn) *rawSocket {
	t.Helper()
	s := new(rawSocket)
	if s.init(c); !s.ok() {
		t.Fatalf("no raw socket for a %T", c)
	}
	return s
}

func TestPlainTCPConnectionsAreReadAndWrittenRaw(t *testing.T) {
	client, server := connPair(t, testOptions())
	if !client.sock.ok() || !server.sock.ok() {
		t.Fatalf("raw sockets: client %v, server %v; want both (a plain TCP connection)", client.sock.ok(), server.sock.ok())
	}
	a, _ := net.Pipe()
	defer a.Close()
	var s rawSocket
	if s.init(a); s.ok() {
		t.Fatal("a net.Pipe got a raw socket; only *net.TCPConn may")
	}
}

// More segments than one writev takes (IOV_MAX), more bytes than the
// socket buffers hold while the peer does not read yet: every byte must
// arrive once, in order.
func TestRawWritevSendsEveryByteInOrderPastIOVMaxAndAFullSocket(t *testing.T) {
	a, b := tcpPair(t)
	a.SetWriteBuffer(16 << 10)
	s := rawOf(t, a)
	var bufs [][]byte
	var want bytes.Buffer
	for i := range 3*maxIovecs + 7 {
		seg := pattern(1+(i*131)%512, byte(i))
		if i%97 == 0 {
			seg = nil // empty segments are skipped
		}
		bufs = append(bufs, seg)
		want.Write(seg)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the writer fills the socket first
		all, _ := io.ReadAll(b)
		got <- all
	}()
	if err := s.writev(bufs...); err != nil {
		t.Fatalf("writev: %v", err)
	}
	a.CloseWrite()
	select {
	case all := <-got:
		if !bytes.Equal(all, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want %d, equal=%v", len(all), want.Len(), bytes.Equal(all, want.Bytes()))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("peer read nothing for 10s")
	}
}

func TestRawReadEndsAsNetConnReadDoes(t *testing.T) {
	t.Run("data, then EOF", func(t *testing.T) {
		a, b := tcpPair(t)
		s := rawOf(t, a)
		b.Write([]byte("hello"))
		b.Close()
		p := make([]byte, 16)
		n, err := s.read(p)
		if err != nil || string(p[:n]) != "hello" {
			t.Fatalf("read = %q, %v; want hello", p[:n], err)
		}
		if n, err := s.read(p); n != 0 || err != io.EOF {
			t.Fatalf("read after the peer closed = %d, %v; want 0, io.EOF", n, err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		a, _ := tcpPair(t)
		s := rawOf(t, a)
		a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := s.read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read past the deadline: %v; want os.ErrDeadlineExceeded", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		a, b := tcpPair(t)
		s := rawOf(t, a)
		b.SetLinger(0)
		b.Close()
		_, err := s.read(make([]byte, 16))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read from a reset connection: %v; want ECONNRESET", err)
		}
	})
	t.Run("closed while waiting", func(t *testing.T) {
		a, _ := tcpPair(t)
		s := rawOf(t, a)
		time.AfterFunc(20*time.Millisecond, func() { a.Close() })
		if _, err := s.read(make([]byte, 16)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read cut by Close: %v; want net.ErrClosed", err)
		}
	})
}

func TestRawWritevToAResetPeerFails(t *testing.T) {
	a, b := tcpPair(t)
	s := rawOf(t, a)
	b.SetLinger(0)
	b.Close()
	payload := [][]byte{make([]byte, 64<<10)}
	var err error
	for range 100 { // the first writes may land before the reset does
		if err = s.writev(payload...); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("writev to a reset peer: %v; want ECONNRESET or EPIPE", err)
	}
}

func TestConsumeDropsWrittenBytesFromTheFront(t *testing.T) {
	x, y, z := []byte("abc"), []byte("defg"), []byte("h")
	iov := func(bs ...[]byte) []syscall.Iovec {
		var v []syscall.Iovec
		for _, b := range bs {
			e := syscall.Iovec{Base: &b[0]}
			e.SetLen(len(b))
			v = append(v, e)
		}
		return v
	}
	left := func(v []syscall.Iovec) string {
		var s string
		for _, e := range v {
			s += string(unsafe.Slice(e.Base, e.Len))
		}
		return s
	}
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "abcdefgh"}, {1, "bcdefgh"}, {3, "defgh"}, {5, "fgh"}, {7, "h"}, {8, ""}} {
		s := &rawSocket{wiov: iov(x, y, z)}
		s.consume(tc.n)
		if got := left(s.wiov); got != tc.want {
			t.Errorf("after %d bytes written, left %q; want %q", tc.n, got, tc.want)
		}
	}
}
