//go:build linux

package shmring

import (
	"context"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kernrpc/kernrpc/kernel"
)

// fakeServer listens on a fresh socket and answers the first client's
// hello with answer (given the ring size the client proposed). It
// returns the address and a channel with the refusal the client sent
// back ("" if none).
func fakeServer(t *testing.T, answer func(uc *net.UnixConn, proposed uint64)) (string, <-chan string) {
	t.Helper()
	path := socketIn(t)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	refusal := make(chan string, 1)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		uc, err := ln.AcceptUnix()
		if err != nil {
			refusal <- "accept: " + err.Error()
			return
		}
		defer uc.Close()
		uc.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 600)
		n, err := uc.Read(buf)
		typ, body, perr := parseMessage(buf[:n])
		if err != nil || perr != nil || typ != msgHello || len(body) < 8 {
			refusal <- "no hello"
			return
		}
		answer(uc, ne.Uint64(body))
		n, _ = uc.Read(buf)
		_, _, err = parseMessage(buf[:n])
		if err != nil {
			refusal <- err.Error()
		} else {
			refusal <- ""
		}
	}()
	return path, refusal
}

// memfd makes a memory file of size bytes, sealed against shrinking if
// sealed, with header written at its start.
func memfd(t *testing.T, size int, sealed bool, header []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("fake-segment", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, header, 0); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// welcome sends the welcome for rings of ringSize, with fd attached when
// it is not negative.
func welcome(uc *net.UnixConn, ringSize uint64, fd int) {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
		defer unix.Close(fd)
	}
	uc.WriteMsgUnix(ne.AppendUint64(message(msgWelcome, 8), ringSize), oob, nil)
}

// segmentHeader is the start of a segment createSegment would make.
func segmentHeader(ringSize uint64) []byte {
	h := append([]byte(segmentMagic), make([]byte, 16)...)
	ne.PutUint32(h[8:], segmentVersion)
	ne.PutUint64(h[16:], ringSize)
	return h
}

// A client trusts nothing a server sends in the handshake: a welcome
// without the segment, rings larger than it proposed, a segment the server
// could still shrink (and so crash the client with SIGBUS), of the wrong
// size, or with a header that does not match, each fails Dial with the
// reason, which the client also sends the server.
func TestClientRefusesABadWelcome(t *testing.T) {
	o := testOptions()
	ring := uint64(o.RingSize)
	size := segmentSize(int(ring))
	for _, tc := range []struct {
		name   string
		answer func(t *testing.T, uc *net.UnixConn, proposed uint64)
		want   string
	}{
		{"ready instead of welcome", func(_ *testing.T, uc *net.UnixConn, _ uint64) { uc.Write(message(msgReady, 0)) },
			"expected the welcome, got message type 4"},
		{"no segment", func(_ *testing.T, uc *net.UnixConn, p uint64) { welcome(uc, p, -1) },
			"the welcome came with 0 file descriptors"},
		{"rings larger than proposed", func(t *testing.T, uc *net.UnixConn, p uint64) {
			welcome(uc, 2*p, memfd(t, segmentSize(int(2*p)), true, segmentHeader(2*p)))
		}, "the server chose rings of 131072 bytes: want a power of two between 16KiB and the 65536 this client proposed"},
		{"segment not sealed", func(t *testing.T, uc *net.UnixConn, p uint64) {
			welcome(uc, p, memfd(t, size, false, segmentHeader(p)))
		}, "the segment is not sealed against shrinking"},
		{"segment of the wrong size", func(t *testing.T, uc *net.UnixConn, p uint64) {
			welcome(uc, p, memfd(t, size/2, true, segmentHeader(p)))
		}, "want " + strconv.Itoa(size) + " for rings of 65536"},
		{"segment header of other rings", func(t *testing.T, uc *net.UnixConn, p uint64) {
			welcome(uc, p, memfd(t, size, true, segmentHeader(p/2)))
		}, "the segment header does not describe version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, refusal := fakeServer(t, func(uc *net.UnixConn, proposed uint64) {
				if proposed != ring {
					t.Errorf("the client proposed rings of %d, want %d", proposed, ring)
				}
				tc.answer(t, uc, proposed)
			})
			tr := newTransport(t, o)
			c, err := tr.Dial(timeout(t, 10*time.Second), addr)
			if err == nil {
				c.Close()
				t.Fatal("Dial accepted the welcome")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial: %v; want it to contain %q", err, tc.want)
			}
			if got := <-refusal; !strings.Contains(got, "refused by the peer") || !strings.Contains(got, tc.want) {
				t.Errorf("the server was told %q; want the refusal with %q", got, tc.want)
			}
		})
	}
}

// Both handshakes run under a deadline (the dial's context, the server's
// wait_timeout), which must be gone before the connection's watcher reads
// the socket: one passing later must not end an attached connection as a
// peer gone.
func TestAConnectionOutlivesItsHandshakesDeadlines(t *testing.T) {
	o := testOptions()
	// Deadlines that a handshake on a loaded machine still meets.
	o.WaitTimeout = kernel.Duration(time.Second)
	tr := newTransport(t, o)
	c, s := connectWithin(t, tr, listen(t, tr), timeout(t, 1500*time.Millisecond))
	time.Sleep(1700 * time.Millisecond) // both deadlines have passed
	for _, end := range []struct {
		name     string
		from, to kernel.Conn
	}{{"client", c, s}, {"server", s, c}} {
		if err := end.from.Err(); err != nil {
			t.Fatalf("the %s's end died once its handshake's deadline passed: %v", end.name, err)
		}
		send(t, end.from, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}, []byte("after the deadlines"))
		got := recv(t, end.to)
		if string(got.Payload) != "after the deadlines" {
			t.Errorf("from the %s: %q", end.name, got.Payload)
		}
		got.Release()
	}
}

// A server may truncate its memfd after the client measured it, then
// seal it: a client that read the size before the seals would map a
// segment shorter than it checked, and its first touch of the header
// would crash it with SIGBUS. Once the seals say the segment cannot
// shrink, the size read after them stays. The server's truncation is
// timed here to fall between the client's two checks (betweenChecks),
// where a hostile server can land it only by chance.
func TestAServerCannotShrinkTheSegmentBetweenTheClientsChecks(t *testing.T) {
	o := testOptions()
	ring := uint64(o.RingSize)
	addr, refusal := fakeServer(t, func(uc *net.UnixConn, p uint64) {
		welcome(uc, p, memfd(t, segmentSize(int(p)), false, segmentHeader(p)))
	})
	betweenChecks = func(fd int) {
		unix.Ftruncate(fd, 0)
		unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	}
	defer func() { betweenChecks = func(int) {} }()
	// A fault in this goroutine panics instead of killing the test binary.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Dial touched a segment the server had shrunk: %v", r)
		}
	}()
	tr := newTransport(t, o)
	c, err := tr.Dial(timeout(t, 10*time.Second), addr)
	if err == nil {
		c.Close()
		t.Fatalf("Dial accepted a segment the server truncated to nothing (rings of %d)", ring)
	}
	if want := "not sealed against shrinking"; !strings.Contains(err.Error(), want) {
		t.Errorf("Dial: %v; want it to say %q", err, want)
	}
	if got := <-refusal; !strings.Contains(got, "refused by the peer") {
		t.Errorf("the server was told %q; want a refusal", got)
	}
}

// A dial whose context ends as the handshake completes fails, and must
// leave nothing held on the server, which may not call Accept for a
// while: the client used to close that connection as any other, with an
// end record, and the server's end, holding a record nobody had read,
// kept its segment and socket for the Accept that would read it. The
// context is cancelled just before the client maps the segment, so that
// some dials fail before the server's end is attached and others after.
func TestADialCancelledAsItAttachesLeavesNothingOnTheServer(t *testing.T) {
	waitNoSegments(t)
	tr := newTransport(t, testOptions())
	ln := listen(t, tr) // never accepted from
	fds := fdCount(t)
	var cancel context.CancelFunc
	betweenChecks = func(int) { cancel() }
	defer func() { betweenChecks = func(int) {} }()
	for range 20 {
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		c, err := tr.Dial(ctx, ln.Addr())
		cancel()
		if err == nil {
			c.Close()
			t.Fatal("Dial succeeded although its context was cancelled during the handshake")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, open := len(segmentMappings(t)), fdCount(t)-fds
		if n == 0 && open <= 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 dials cancelled during their handshakes left %d segments mapped and %d descriptors open on the server", n, open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
