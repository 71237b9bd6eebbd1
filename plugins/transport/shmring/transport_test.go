//go:build linux

package shmring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func TestOptionErrorsNameTheOption(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"ring_size not a power of two", func(o *Options) { o.RingSize = 100 << 10 }, `"ring_size"`},
		{"ring_size too small", func(o *Options) { o.RingSize = 4 << 10 }, `"ring_size"`},
		{"ring_size too large", func(o *Options) { o.RingSize = 2 << 30 }, `"ring_size"`},
		{"max_frame_size below the fixed header", func(o *Options) { o.MaxFrameSize = 8 }, `"max_frame_size"`},
		{"max_frame_size over 32 bits", func(o *Options) { o.MaxFrameSize = 1 << 32 }, `"max_frame_size"`},
		{"spin negative", func(o *Options) { o.Spin = -1 }, `"spin"`},
		{"spin unbounded", func(o *Options) { o.Spin = kernel.Duration(time.Second) }, `"spin"`},
		{"wait_timeout zero", func(o *Options) { o.WaitTimeout = 0 }, `"wait_timeout"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.mutate(o)
			_, err := New(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "shm-ring: option ") {
				t.Fatalf("New with %s: %v, want an error naming %s", tc.name, err, tc.want)
			}
		})
	}
}

func TestConfigOptionsReachTheTransport(t *testing.T) {
	tr, err := kernel.NewTransport(Name, map[string]any{"ring_size": "1MiB", "spin": "0", "wait_timeout": "1s", "allow_uids": []any{1234}}, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := tr.(*transport)
	if got.ringSize != 1<<20 || got.spin != 0 || got.waitTimeout != time.Second || got.maxFrame != kernel.DefaultMaxFrameSize ||
		!got.allowed(1234) || !got.allowed(uint32(os.Getuid())) || got.allowed(4321) {
		t.Fatalf("transport built from config: %+v", got)
	}
	if caps, ok := tr.(kernel.TransportCapabilities); !ok || !caps.LendsMemory() {
		t.Fatal("shm-ring must declare that it lends memory")
	}
	if _, err = kernel.NewTransport(Name, map[string]any{"ring_size": "3KiB"}, "test.yaml"); err == nil ||
		!strings.Contains(err.Error(), `"ring_size"`) || !strings.Contains(err.Error(), "test.yaml") {
		t.Fatalf("bad option from config: %v", err)
	}
}

// TestPackageDocListsEveryOption keeps the doc comment in step with the
// options struct.
func TestPackageDocListsEveryOption(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for f := range reflect.TypeFor[Options]().Fields() {
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if key != "-" && !strings.Contains(string(doc), key) {
			t.Errorf("doc.go does not describe option %q", key)
		}
	}
}

// TestProtocolDocDescribesTheCode keeps docs/protocol.md's byte-by-byte
// description of segments and records in step with the constants.
func TestProtocolDocDescribesTheCode(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## shm-ring")
	if !ok {
		t.Fatal("docs/protocol.md has no shm-ring section")
	}
	for _, want := range []string{
		"magic, ASCII `" + segmentMagic + "`",
		fmt.Sprintf("type: %d hello, %d welcome, %d refuse, %d ready", msgHello, msgWelcome, msgRefuse, msgReady),
		fmt.Sprintf("version, `%d`", segmentVersion),
		"memfd named `" + memfdName + "`",
		fmt.Sprintf("| %d | %d | ring 0 control page", pageSize, pageSize),
		fmt.Sprintf("| %d | 8 | `head`", headOff),
		fmt.Sprintf("| %d | 8 | `tail`", tailOff),
		fmt.Sprintf("| %d | 4 | reader sleep word", readerWordOff),
		fmt.Sprintf("| %d | 4 | writer sleep word", writerWordOff),
		fmt.Sprintf("| %d | wake reader |", wakeReader),
		fmt.Sprintf("| %d | wake writers |", wakeWriters),
		fmt.Sprintf("| %d | 4 | held count", heldCountOff),
		fmt.Sprintf("| %d | %d × 16 | held table", heldTableOff, maxHeld),
		fmt.Sprintf("| %d | pad |", kindPad),
		fmt.Sprintf("| %d | wrap |", kindWrap),
		fmt.Sprintf("| %d | frame |", kindFrame),
		fmt.Sprintf("| %d | first chunk |", kindFirstChunk),
		fmt.Sprintf("| %d | chunk |", kindChunk),
		fmt.Sprintf("| %d | abort |", kindAbort),
		fmt.Sprintf("| %d | end |", kindEnd),
		fmt.Sprintf("buffer %d bytes into a record", lentPrefix),
		"at least 16",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("docs/protocol.md's shm-ring section does not say %q", want)
		}
	}
	if segmentSize(1<<20) != 3*pageSize+2<<20 {
		t.Error("the segment is no longer 3 pages and two rings long, as the doc says")
	}
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		addr, path string
		auto       bool
		err        string
	}{
		{"/run/kernrpc/echo.sock", "/run/kernrpc/echo.sock", false, ""},
		{"shm-ring:///run/kernrpc/echo.sock", "/run/kernrpc/echo.sock", false, ""},
		{"echo.sock", "echo.sock", false, ""},
		{"@kernrpc-echo", "@kernrpc-echo", false, ""},
		{"@kernrpc:echo", "@kernrpc:echo", false, ""},
		{"127.0.0.1:0", "", true, ""},
		{"localhost:8080", "", false, "is host:port"},
		{"", "", false, "empty address"},
		{"shm-ring://", "", false, "empty address"},
	} {
		path, auto, err := socketPath(tc.addr)
		if path != tc.path || auto != tc.auto || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("socketPath(%q) = %q, %t, %v; want %q, %t, error containing %q", tc.addr, path, auto, err, tc.path, tc.auto, tc.err)
		}
	}
}

// An abstract socket name is whatever follows "@", colons included: one
// that looks like host:port ("@kernrpc:echo", "@kernrpc:0") is still a
// name to listen on and dial, not a TCP address or a request for a fresh
// name.
func TestAnAbstractNameWithAColonIsAName(t *testing.T) {
	tr := newTransport(t, testOptions())
	for _, suffix := range []string{"echo", "0"} {
		name := fmt.Sprintf("@kernrpc-test-%d:%s", os.Getpid(), suffix)
		ln, err := tr.Listen(context.Background(), name)
		if err != nil {
			t.Fatalf("Listen on %q: %v", name, err)
		}
		if ln.Addr() != name {
			ln.Close()
			t.Fatalf("Listen on %q listens on %q", name, ln.Addr())
		}
		c, s := connectWithin(t, tr, ln, timeout(t, 10*time.Second))
		c.Close()
		s.Close()
		ln.Close()
	}
}

func TestPortZeroListensOnAFreshAbstractName(t *testing.T) {
	tr := newTransport(t, testOptions())
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !strings.HasPrefix(ln.Addr(), "@") {
		t.Fatalf("Addr %q is not an abstract socket name", ln.Addr())
	}
	c, s := connect(t, tr, ln)
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 5}, []byte("hi"))
	if f := recv(t, s); f.CallID != 5 {
		t.Fatalf("frame arrived as call %d", f.CallID)
	} else {
		f.Release()
	}
	if _, err := tr.Dial(timeout(t, time.Second), "127.0.0.1:0"); err == nil {
		t.Fatal("dialling port 0 succeeded")
	}
}

func TestListenReplacesAStaleSocketButNotALiveOne(t *testing.T) {
	path := socketIn(t)
	// A socket file whose server died: nobody listens behind it.
	dead, err := net.Listen("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	dead.(*net.UnixListener).SetUnlinkOnClose(false)
	dead.Close()
	tr := newTransport(t, testOptions())
	ln, err := tr.Listen(context.Background(), path)
	if err != nil {
		t.Fatalf("Listen over a stale socket file: %v", err)
	}
	if _, err := tr.Listen(context.Background(), path); err == nil || !strings.Contains(err.Error(), "another server is listening") {
		t.Fatalf("Listen where a live server listens: %v", err)
	}
	ln.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket file outlived its listener: %v", err)
	}
}

// Two servers started at once over the socket file a dead one left must
// not both listen: the one whose file the other removed as stale would
// listen where no client can reach it.
func TestConcurrentListensOverAStaleSocketLeaveOneServer(t *testing.T) {
	tr := newTransport(t, testOptions())
	path := socketIn(t)
	for i, end := 0, time.Now().Add(2*time.Second); i < 3000 && time.Now().Before(end); i++ {
		os.Remove(path)
		dead, err := net.Listen("unixpacket", path)
		if err != nil {
			t.Fatal(err)
		}
		dead.(*net.UnixListener).SetUnlinkOnClose(false)
		dead.Close()
		var lns [2]kernel.Listener
		var wg sync.WaitGroup
		for j := range lns {
			wg.Go(func() { lns[j], _ = tr.Listen(context.Background(), path) })
		}
		wg.Wait()
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
		if lns[0] != nil && lns[1] != nil {
			t.Fatalf("round %d: both Listens succeeded on %s; the socket file of one was removed by the other", i, path)
		}
		if lns[0] == nil && lns[1] == nil {
			t.Fatalf("round %d: neither Listen succeeded over a stale socket file", i)
		}
	}
}

func TestListenerCloseEndsAcceptAndLeavesConnections(t *testing.T) {
	tr := newTransport(t, testOptions())
	ln, err := tr.Listen(context.Background(), socketIn(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ln.Accept(timeout(t, 20*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept with an expiring ctx: %v", err)
	}
	c, s := connect(t, tr, ln)
	pending := make(chan error, 1)
	go func() {
		_, err := ln.Accept(context.Background())
		pending <- err
	}()
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
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 6}, []byte("still here"))
	if f := recv(t, s); f.CallID != 6 {
		t.Fatalf("frame after the listener closed arrived as call %d", f.CallID)
	} else {
		f.Release()
	}
}

func TestDialingNothingFailsPromptly(t *testing.T) {
	tr := newTransport(t, testOptions())
	missing := filepath.Join(t.TempDir(), "none.sock")
	start := time.Now()
	if _, err := tr.Dial(timeout(t, 5*time.Second), missing); err == nil || !strings.Contains(err.Error(), "shm-ring: dial "+missing) {
		t.Fatalf("Dial to a missing socket: %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Dial took %v to fail", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.Dial(ctx, missing); err == nil {
		t.Fatal("Dial with a cancelled ctx succeeded")
	}
}

// A peer that speaks something else on the socket, or proposes rings no
// server may make, is refused with the reason, and the listener goes on
// attaching others.
func TestListenerRefusesAPeerThatIsNotShmRing(t *testing.T) {
	tr := newTransport(t, testOptions())
	ln := listen(t, tr)
	for _, tc := range []struct {
		name  string
		hello []byte
		want  string
	}{
		{"not shm-ring", []byte("GET / HTTP/1.1\r\n\r\n"), "refused by the peer"},
		{"bad ring size", ne.AppendUint64(message(msgHello, 8), 1000), "proposed ring size 1000 is not a power of two between 16KiB and 1GiB"},
	} {
		raw, err := net.Dial("unixpacket", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		raw.Write(tc.hello)
		buf := make([]byte, 600)
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := raw.Read(buf)
		raw.Close()
		if typ, _, err := parseMessage(buf[:n]); err == nil || typ != 0 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: answered %q; want a refusal with %q", tc.name, buf[:n], tc.want)
		}
	}
	c, s := connect(t, tr, ln)
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 7}, nil)
	if f := recv(t, s); f.CallID != 7 {
		t.Fatalf("call %d", f.CallID)
	} else {
		f.Release()
	}
}
