//go:build linux

package shmring

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// The test binary doubles as the helper processes the kill tests kill:
// with helperEnv set it runs the role named there on addrEnv instead of
// the tests, prints what it has done line by line, and exits when its
// standard input closes.
const (
	helperEnv    = "SHMRING_HELPER"
	addrEnv      = "SHMRING_ADDR"
	transportEnv = "SHMRING_TRANSPORT"
	// hangCalls is how many calls the helpers leave pending.
	hangCalls = 4
)

func runHelper(role string) {
	addr := os.Getenv(addrEnv)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var err error
	switch role {
	case "server":
		err = helperServer(addr)
	case "client":
		err = helperClient(addr)
	case "dial":
		err = helperDial(addr)
	case "listen":
		err = helperListen()
	case "echo":
		err = helperEcho(addr)
	case "idle":
		err = helperIdle(addr)
	case "setuid":
		err = helperSetuid()
	default:
		err = fmt.Errorf("unknown helper role %q", role)
	}
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	select {}
}

// helperServer serves echo and a method that answers only when its call
// is cancelled, printing HANG as each such call arrives. transportEnv
// names another transport for the benchmarks to compare.
func helperServer(addr string) error {
	cfg := clientConfig(addr, nil)
	cfg.Address = addr
	if name := os.Getenv(transportEnv); name != "" {
		cfg.Transport.Name = name
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return err
	}
	kernrpc.Handle(srv, "Echo.Echo", echo)
	kernrpc.Handle(srv, "Echo.Hang", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		fmt.Println("HANG")
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if err := srv.Start(context.Background()); err != nil {
		return err
	}
	fmt.Println("READY", srv.Addr())
	return nil
}

// helperClient makes one echo call, then leaves hangCalls calls pending.
func helperClient(addr string) error {
	cli, err := kernrpc.NewClient(clientConfig(addr, nil), "echo")
	if err != nil {
		return err
	}
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "attach"}, &resp); err != nil {
		return err
	}
	for range hangCalls {
		go cli.Call(context.Background(), "Echo.Hang", &echopb.Echo{}, &echopb.Echo{})
	}
	fmt.Println("CALLING")
	return nil
}

// helperOptions trust the test process, which runs as root when the
// helpers run as someone else.
func helperOptions() *Options {
	o := testOptions()
	o.AllowUIDs = []uint32{0}
	return o
}

// helperDial attaches at the transport level and says how it went.
func helperDial(addr string) error {
	tr, err := New(helperOptions())
	if err != nil {
		return err
	}
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		return err
	}
	c.Close()
	fmt.Println("ATTACHED")
	return nil
}

// helperListen listens at a fresh abstract address and accepts whoever
// attaches.
func helperListen() error {
	tr, err := New(helperOptions())
	if err != nil {
		return err
	}
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("ADDR", ln.Addr())
	go func() {
		for {
			if _, err := ln.Accept(context.Background()); err != nil {
				return
			}
		}
	}()
	return nil
}

// helperEcho echoes every frame on every connection at the transport
// level, for the benchmarks to measure the transport without the kernel.
func helperEcho(addr string) error {
	tr, err := New(helperOptions())
	if err != nil {
		return err
	}
	ln, err := tr.Listen(context.Background(), addr)
	if err != nil {
		return err
	}
	fmt.Println("READY", ln.Addr())
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go echoFrames(c)
		}
	}()
	return nil
}

// helperSetuid runs as a set-user-ID program does, its real uid nobody's
// and its effective uid root's, and attaches to itself: a process must
// trust what the kernel reports for a process of its own credentials.
func helperSetuid() error {
	if err := syscall.Setresuid(65534, 0, 0); err != nil {
		return err
	}
	tr, err := New(testOptions())
	if err != nil {
		return err
	}
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() {
		if c, err := ln.Accept(context.Background()); err == nil {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tr.Dial(ctx, ln.Addr())
	if err != nil {
		return err
	}
	c.Close()
	fmt.Println("ATTACHED")
	return nil
}

// helper is a running helper process and its output, line by line.
type helper struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHelper(t testing.TB, role, addr string, cred *syscall.Credential, env ...string) *helper {
	t.Helper()
	exe := os.Args[0]
	if cred != nil {
		exe = executableByAll(t)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, addrEnv+"="+addr), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		if cred != nil {
			t.Skipf("cannot start a helper as uid %d: %v", cred.Uid, err)
		}
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

// executableByAll copies the test binary where another user can run it:
// the go tool builds it in a directory only its owner may enter.
func executableByAll(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shmring-helper")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	exe := dir + "/helper"
	src, err := os.ReadFile(os.Args[0])
	if err == nil {
		err = os.WriteFile(exe, src, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatalf("copying the test binary for another user: %v", err)
	}
	return exe
}

// expect waits for the helper to print a line starting with prefix and
// returns the rest of it.
func (h *helper) expect(t testing.TB, prefix string) string {
	t.Helper()
	return h.expectWithin(t, prefix, 20*time.Second)
}

func (h *helper) expectWithin(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				t.Fatalf("the helper exited before printing %q", prefix)
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return strings.TrimSpace(rest)
			}
			if strings.HasPrefix(line, "ERR") {
				t.Fatalf("helper: %s (waiting for %q)", line, prefix)
			}
		case <-timer.C:
			t.Fatalf("the helper did not print %q", prefix)
		}
	}
}

// survivorBound is how soon after a peer's process is killed the survivor
// must fail what was pending on it.
const survivorBound = 100 * time.Millisecond

func TestKilledClientProcessFreesItsCallsAndSegment(t *testing.T) {
	waitNoSegments(t)
	shm := devShm(t)
	addr := socketIn(t)
	cancelled := make(chan time.Time, hangCalls)
	arrived := make(chan struct{}, hangCalls)
	startServer(t, kernelConfig(t, addr, nil), func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hang", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			arrived <- struct{}{}
			<-ctx.Done()
			cancelled <- time.Now()
			return nil, ctx.Err()
		})
	})
	h := startHelper(t, "client", addr, nil)
	h.expect(t, "CALLING")
	for range hangCalls {
		select {
		case <-arrived:
		case <-time.After(20 * time.Second):
			t.Fatal("the client's calls did not reach the server")
		}
	}
	if n := len(segmentMappings(t)); n != 1 {
		t.Fatalf("%d segments mapped with one client attached, want 1", n)
	}
	killed := time.Now()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range hangCalls {
		select {
		case at := <-cancelled:
			if d := at.Sub(killed); d > survivorBound {
				t.Errorf("a handler of the killed client was cancelled %v after the kill, want within %v", d, survivorBound)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the handlers of a killed client were never cancelled")
		}
	}
	waitNoSegments(t)
	checkDevShm(t, shm)
	// The server is unharmed: a new client attaches and calls.
	var resp echopb.Echo
	if err := newClient(t, clientConfig(addr, nil)).Call(timeout(t, 10*time.Second), "Echo.Echo", &echopb.Echo{Text: "next"}, &resp); err != nil || resp.Text != "next" {
		t.Fatalf("a client after the killed one: %v", err)
	}
}

func TestKilledServerProcessFailsPendingCallsWithUnavailable(t *testing.T) {
	waitNoSegments(t)
	shm := devShm(t)
	addr := socketIn(t)
	h := startHelper(t, "server", addr, nil)
	h.expect(t, "READY")
	cli := newClient(t, clientConfig(addr, nil))
	var resp echopb.Echo
	if err := cli.Call(timeout(t, 10*time.Second), "Echo.Echo", &echopb.Echo{Text: "attach"}, &resp); err != nil {
		t.Fatal(err)
	}
	type result struct {
		err error
		at  time.Time
	}
	results := make(chan result, hangCalls)
	for range hangCalls {
		go func() {
			err := cli.Call(context.Background(), "Echo.Hang", &echopb.Echo{}, &echopb.Echo{})
			results <- result{err, time.Now()}
		}()
	}
	for range hangCalls {
		h.expect(t, "HANG")
	}
	killed := time.Now()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range hangCalls {
		select {
		case r := <-results:
			if kernel.CodeOf(r.err) != kernel.Unavailable {
				t.Errorf("pending call ended with %v, want Unavailable", r.err)
			}
			if d := r.at.Sub(killed); d > survivorBound {
				t.Errorf("pending call failed %v after the kill, want within %v", d, survivorBound)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("calls pending on a killed server never failed")
		}
	}
	waitNoSegments(t)
	checkDevShm(t, shm)
	// A server restarted on the same path replaces the dead one's socket.
	h2 := startHelper(t, "server", addr, nil)
	h2.expect(t, "READY")
	if err := cli.Call(timeout(t, 10*time.Second), "Echo.Echo", &echopb.Echo{Text: "again"}, &resp); err != nil || resp.Text != "again" {
		t.Fatalf("call to the restarted server: %v", err)
	}
}

// nobody is an unprivileged user for the credential tests, which need to
// run as root to start a process as someone else.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

func TestServerAttachesOnlyAllowedUIDs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a helper as another user")
	}
	for _, tc := range []struct {
		name  string
		allow []uint32
		want  string
	}{
		{"refused by default", nil, "ERR"},
		{"allowed by allow_uids", []uint32{65534}, "ATTACHED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions()
			o.AllowUIDs = tc.allow
			// An abstract socket: the helper needs no access to a directory.
			ln, err := newTransport(t, o).Listen(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				if c, err := ln.Accept(timeout(t, 20*time.Second)); err == nil {
					c.Close()
				}
			}()
			h := startHelper(t, "dial", ln.Addr(), nobody)
			select {
			case line := <-h.lines:
				if !strings.HasPrefix(line, tc.want) {
					t.Fatalf("helper running as uid 65534 said %q, want %s", line, tc.want)
				}
				if tc.want == "ERR" && !strings.Contains(line, "uid 65534 may not attach") {
					t.Fatalf("refusal does not say why: %q", line)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the helper said nothing")
			}
		})
	}
}

func TestClientRefusesAServerOfAnotherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a helper as another user")
	}
	h := startHelper(t, "listen", "", nobody)
	addr := h.expect(t, "ADDR")
	_, err := newTransport(t, testOptions()).Dial(timeout(t, 10*time.Second), addr)
	if err == nil || !strings.Contains(err.Error(), "runs as uid 65534, which this client does not trust") {
		t.Fatalf("dialling a server run by uid 65534: %v", err)
	}
	o := testOptions()
	o.AllowUIDs = []uint32{65534}
	c, err := newTransport(t, o).Dial(timeout(t, 10*time.Second), addr)
	if err != nil {
		t.Fatalf("dialling it with allow_uids [65534]: %v", err)
	}
	c.Close()
}

// SO_PEERCRED reports a peer's effective uid, so that is the uid a
// process must count as its own: a set-user-ID program (real uid nobody,
// effective uid root) compared the peer's effective uid with its own real
// one, and refused to attach even to itself.
func TestAProcessWhoseRealAndEffectiveUIDsDifferAttachesToItself(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a helper whose real and effective uids differ")
	}
	h := startHelper(t, "setuid", "", nil)
	select {
	case line := <-h.lines:
		if !strings.HasPrefix(line, "ATTACHED") {
			t.Fatalf("a process with real uid 65534 and effective uid 0 attaching to itself: %s", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the helper said nothing")
	}
}
