package kernrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// How calls end when something else does: a server shutting down, a
// server process dying, a client closing, callers giving up.

func TestGracefulShutdownUnderLoadLosesNoCall(t *testing.T) {
	cfg := testConfig(t)
	slow := func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Slow", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			time.Sleep(2 * time.Millisecond)
			return req, nil
		})
	}
	a := startServer(t, cfg, slow)
	startServer(t, cfg, slow)
	cli := newClient(t, cfg)

	load := enginetest.StartLoad("calls", 16, func(int) error {
		var resp echopb.Echo
		return cli.Call(context.Background(), "Echo.Slow", &echopb.Echo{Text: "x"}, &resp)
	})
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	cancel()
	time.Sleep(100 * time.Millisecond)
	load.Stop()
	load.Check(t, 50)
}

func TestShutdownDrainsInFlightCalls(t *testing.T) {
	cfg := testConfig(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", holding(entered, release))
	})
	cli := newClient(t, cfg)
	results := make(chan error, 4)
	for range 4 {
		go func() { results <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}) }()
	}
	for range 4 {
		<-entered
	}
	shutdownDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shutdownDone <- srv.Shutdown(ctx)
	}()
	time.Sleep(50 * time.Millisecond)
	// A new call now finds no instance (the server left the registry
	// first), is refused as retryable or cannot connect: never lost.
	cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
	err := cli.Call(cctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
	ccancel()
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Errorf("call during shutdown: %v, want Unavailable", err)
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("shutdown returned (%v) while calls were in flight", err)
	default:
	}
	close(release)
	for range 4 {
		if err := <-results; err != nil {
			t.Errorf("in-flight call lost in shutdown: %v", err)
		}
	}
	if err := <-shutdownDone; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if insts, _ := kernel.NewRegistry("memory", map[string]any{"namespace": t.Name()}, ""); insts != nil {
		got, _ := insts.Resolve(context.Background(), "echo")
		if len(got) != 0 {
			t.Errorf("instance still registered after shutdown: %v", got)
		}
		_ = insts.Close()
	}
}

// TestHelperServerProcess is not a test: it is the server process that the
// kill tests start, so that a real process can be killed.
func TestHelperServerProcess(t *testing.T) {
	if os.Getenv("KERNRPC_HELPER_SERVER") != "1" {
		t.Skip("helper process for the kill tests")
	}
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	if addr := os.Getenv("KERNRPC_HELPER_ADDR"); addr != "" {
		cfg.Address = addr
	}
	if tr := os.Getenv("KERNRPC_HELPER_TRANSPORT"); tr != "" {
		cfg.Transport.Name = tr
	}
	if f := os.Getenv("KERNRPC_HELPER_FILTER"); f != "" {
		cfg.Filters = []kernrpc.FilterConfig{{Name: f, Side: "server"}}
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Echo", echo)
	kernrpc.Handle(srv, "Echo.Hang", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	newWatcher().register(srv) // one stream per process: nobody drains opened
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	fmt.Println("ADDR", srv.Addr())
	select {}
}

func startServerProcess(t *testing.T) (*exec.Cmd, string) {
	return startServerProcessTB(t)
}

func startServerProcessTB(t testing.TB, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServerProcess$")
	cmd.Env = append(append(os.Environ(), "KERNRPC_HELPER_SERVER=1"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var addr string
	buf := make([]byte, 256)
	deadline := time.Now().Add(10 * time.Second)
	var acc []byte
	for addr == "" && time.Now().Before(deadline) {
		n, err := out.Read(buf)
		acc = append(acc, buf[:n]...)
		if i := bytes.Index(acc, []byte("ADDR ")); i >= 0 {
			if j := bytes.IndexByte(acc[i:], '\n'); j > 0 {
				addr = string(acc[i+5 : i+j])
			}
		}
		if err != nil {
			break
		}
	}
	if addr == "" {
		t.Fatalf("helper server printed no address: %q", acc)
	}
	return cmd, addr
}

func TestDeadServerFailsPendingCallsWithUnavailable(t *testing.T) {
	cases := []struct {
		name  string
		kill  func(*exec.Cmd)
		bound time.Duration
	}{
		// The OS closes a killed process's sockets: the client hears at once.
		{"killed", func(c *exec.Cmd) { _ = c.Process.Signal(syscall.SIGKILL) }, 2 * time.Second},
		// A stopped process keeps its sockets open but answers nothing: only
		// keepalive (100ms interval + 200ms timeout here) can tell.
		{"frozen", func(c *exec.Cmd) { _ = c.Process.Signal(syscall.SIGSTOP) }, 2 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd, addr := startServerProcess(t)
			cfg := testConfig(t)
			cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
			cli := newClient(t, cfg)
			var resp echopb.Echo
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "alive"}, &resp); err != nil {
				t.Fatalf("first call: %v", err)
			}
			errs := make(chan error, 4)
			for range 4 {
				go func() { errs <- cli.Call(context.Background(), "Echo.Hang", &echopb.Echo{}, &echopb.Echo{}) }()
			}
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			tc.kill(cmd)
			for range 4 {
				select {
				case err := <-errs:
					if kernel.CodeOf(err) != kernel.Unavailable {
						t.Errorf("pending call ended with %v, want Unavailable", err)
					}
				case <-time.After(tc.bound + time.Second):
					t.Fatalf("pending call still waiting %v after the server died", time.Since(start))
				}
			}
			if el := time.Since(start); el > tc.bound {
				t.Errorf("pending calls failed after %v, want within %v", el, tc.bound)
			}
			_ = cmd.Process.Signal(syscall.SIGKILL)
		})
	}
}

// A server killed while its client's connection idled, and started again
// at the same address: the client's next call is served by the new one.
// The connection's end waited unread in the client's socket (nobody reads
// a connection with no call on it); the call must not be written there,
// where it would be lost with the connection, but sent on a new one. So
// too when the end waits behind an answer nobody read: the late answer of
// a call that gave up at its deadline.
func TestACallAfterTheServerRestartedIsServed(t *testing.T) {
	for _, tr := range streamTransports {
		for _, late := range []bool{false, true} {
			name := tr
			if late {
				name += "/behind a late answer"
			}
			t.Run(name, func(t *testing.T) { testRestartedServer(t, tr, late) })
		}
	}
}

func testRestartedServer(t *testing.T, tr string, late bool) {
	env := "KERNRPC_HELPER_TRANSPORT=" + tr
	first, addr := startServerProcessTB(t, env)
	cfg := testConfig(t)
	if tr != "tcp-lv" {
		cfg.Transport.Name, cfg.Transport.Options = tr, nil
	}
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	cli := newClient(t, cfg)
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "first"}, &resp); err != nil {
		t.Fatalf("call to the first server: %v", err)
	}
	if late {
		// Echo.Hang answers when the call's context ends: after the
		// client gave up, so nobody reads the answer.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := cli.Call(ctx, "Echo.Hang", &echopb.Echo{}, &resp)
		cancel()
		if kernel.CodeOf(err) != kernel.DeadlineExceeded {
			t.Fatalf("Echo.Hang with a 50ms deadline: %v, want DeadlineExceeded", err)
		}
		time.Sleep(100 * time.Millisecond) // for the late answer to arrive
	}
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	startServerProcessTB(t, env, "KERNRPC_HELPER_ADDR="+addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "second"}, &resp); err != nil || resp.Text != "second" {
		t.Fatalf("call after the restart: %q, %v; want it served by the new server", resp.Text, err)
	}
}

func BenchmarkCallInProcess16B(b *testing.B) {
	cfg := testConfig(b)
	startServer(b, cfg, nil)
	cli := newClient(b, cfg)
	req := &echopb.Echo{Payload: make([]byte, 16)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		var resp echopb.Echo
		if err := cli.Call(ctx, "Echo.Echo", req, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallOtherProcess16B calls a server in a process of its own, as
// users deploy it; compare with tcp-lv's BenchmarkPingPong16B (the same
// bytes without the kernel) to see what the kernel adds.
func BenchmarkCallOtherProcess16B(b *testing.B) {
	cmd, addr := startServerProcessTB(b)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	cfg := testConfig(b)
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	cli := newClient(b, cfg)
	req := &echopb.Echo{Payload: make([]byte, 16)}
	var resp echopb.Echo
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := cli.Call(ctx, "Echo.Echo", req, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

func TestShutdownDeadlineCancelsWhatStillRuns(t *testing.T) {
	cfg := testConfig(t)
	handlerCtxErr := make(chan error, 1)
	entered := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Stubborn", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			close(entered)
			<-ctx.Done() // told to stop when the shutdown deadline passes
			handlerCtxErr <- ctx.Err()
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	callErr := make(chan error, 1)
	go func() { callErr <- cli.Call(context.Background(), "Echo.Stubborn", &echopb.Echo{}, &echopb.Echo{}) }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err == nil || !strings.Contains(err.Error(), "calls still in flight (1)") {
		t.Fatalf("Shutdown = %v, want it to report the call it had to abandon", err)
	}
	herr := receive(t, handlerCtxErr, 3*time.Second, "the handler's context was not cancelled when the shutdown deadline passed")
	if herr == nil {
		t.Fatal("handler context not cancelled")
	}
	err = receive(t, callErr, 3*time.Second, "the abandoned call never returned")
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("abandoned call ended with %v, want Unavailable", err)
	}
}

func TestClientCloseFailsCallsInFlight(t *testing.T) {
	cfg := testConfig(t)
	entered := make(chan struct{})
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hang", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	callErr := make(chan error, 1)
	go func() { callErr <- cli.Call(context.Background(), "Echo.Hang", &echopb.Echo{}, &echopb.Echo{}) }()
	<-entered
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	err = receive(t, callErr, 3*time.Second, "Close left a call waiting")
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("call in flight at Close ended with %v, want Unavailable", err)
	}
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.Canceled {
		t.Fatalf("call after Close: %v, want Canceled (client closed)", err)
	}
	if st, err := cli.NewStream(context.Background(), "Echo.Stream"); st != nil || kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), `client for "echo" is closed`) {
		t.Fatalf("stream after Close: %v, %v; want Canceled (client closed)", st, err)
	}
	if err := cli.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Callers that give up at random moments hand the reader role around in
// every order the leader/follower scheme allows: no call may hang, lose its
// answer or get another's, whoever was reading when a caller left.
func TestCallersGivingUpAtRandomNeverStrandTheOthers(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Jitter", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			select {
			case <-time.After(time.Duration(len(req.Payload)) * 50 * time.Microsecond):
				return req, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	})
	cli := newClient(t, cfg)
	const callers, perCaller = 32, 60
	var wg sync.WaitGroup
	var answered, gaveUp atomic.Int64
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range perCaller {
				n := (g*7 + i*13) % 40 // handler time: 0 to 2ms; deadlines 50µs to 14.55ms, or 1s
				limit := time.Duration((g*11+i*5)%30) * 500 * time.Microsecond
				if i%3 == 0 {
					limit = time.Second // some callers are patient, even on a loaded machine
				}
				ctx, cancel := context.WithTimeout(context.Background(), limit+50*time.Microsecond)
				want := fmt.Sprintf("%d/%d", g, i)
				var resp echopb.Echo
				err := cli.Call(ctx, "Echo.Jitter", &echopb.Echo{Text: want, Payload: make([]byte, n)}, &resp)
				cancel()
				switch kernel.CodeOf(err) {
				case kernel.OK:
					if resp.Text != want {
						errs <- fmt.Errorf("call %s got the answer to %s", want, resp.Text)
						return
					}
					answered.Add(1)
				case kernel.DeadlineExceeded:
					gaveUp.Add(1)
				default:
					errs <- fmt.Errorf("call %s: %v", want, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("calls stranded: %d answered, %d gave up, of %d", answered.Load(), gaveUp.Load(), callers*perCaller)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The connection is still sound afterwards.
	var resp echopb.Echo
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "after"}, &resp); err != nil || resp.Text != "after" {
		t.Fatalf("call after the storm: %v", err)
	}
	if answered.Load() == 0 || gaveUp.Load() == 0 {
		t.Fatalf("%d answered and %d gave up: the mix this test needs did not happen", answered.Load(), gaveUp.Load())
	}
}
