package kernrpc_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// fixedAddress returns an address for transport that a server can listen
// on, stop, and listen on again: a TCP port free a moment ago, or an
// abstract socket name.
func fixedAddress(t *testing.T, transport string) string {
	t.Helper()
	if transport != "tcp-lv" {
		return "@kernrpc-ready-" + strings.ReplaceAll(t.Name(), "/", "-")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// lonePair returns a server config for addr and a client config that
// knows the server only by that address, from a static list: the server
// registers elsewhere, so no registry report tells the client anything.
func lonePair(t *testing.T, cfg *kernrpc.Config, addr string) (server, client *kernrpc.Config) {
	server = testConfig(t)
	server.Transport = cfg.Transport
	server.Address = addr
	server.Registry.Options = map[string]any{"namespace": t.Name() + "-server"}
	client = testConfig(t)
	client.Transport = cfg.Transport
	client.Registry.Options = map[string]any{"static": map[string]any{"echo": []any{addr}}}
	return server, client
}

// A lone server at a fixed address restarts three times, down for 150 ms
// each time, under callers with 3 s deadlines. Callers that wait for
// readiness lose no call and no stream; callers that do not fail in the
// gaps, at once, with Unavailable (the default: fail fast).
func TestWaitForReadyWaitsOutALoneServersRestart(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		serverCfg, clientCfg := lonePair(t, cfg, fixedAddress(t, cfg.Transport.Name))
		srv := startServer(t, serverCfg, streamHandlers)
		clientCfg.Client.WaitForReady = true
		waiting := newClient(t, clientCfg)
		failing := newClient(t, testConfigLike(t, clientCfg, false))

		call := func(cli *kernrpc.Client) func(int) error {
			return func(int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				return cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "x"}, &echopb.Echo{})
			}
		}
		calls := enginetest.StartLoad("calls", 6, call(waiting))
		streams := enginetest.StartLoad("streams", 2, func(int) error { return countUp(waiting, nil, 3) })
		fast := enginetest.StartLoad("calls that fail fast", 2, call(failing))
		for range 3 {
			time.Sleep(100 * time.Millisecond)
			if err := srv.Shutdown(context.Background()); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			time.Sleep(150 * time.Millisecond)
			srv = startServer(t, serverCfg, streamHandlers)
		}
		time.Sleep(100 * time.Millisecond)
		calls.Stop()
		streams.Stop()
		fast.Stop()
		t.Logf("%s and %s through 3 restarts; %s, %d failed", calls, streams, fast, fast.Failed())
		calls.Check(t, 30)
		streams.Check(t, 10)
		if fast.Failed() == 0 {
			t.Errorf("no call without wait_for_ready failed while the server was down: the test did not make a gap")
		}
		for _, err := range fast.FirstErrors() {
			if kernel.CodeOf(err) != kernel.Unavailable {
				t.Errorf("a call without wait_for_ready failed with %v, want Unavailable", err)
			}
		}
	})
}

// testConfigLike is a client config like cfg with wait_for_ready set to
// wait.
func testConfigLike(t *testing.T, cfg *kernrpc.Config, wait bool) *kernrpc.Config {
	c := testConfig(t)
	c.Transport, c.Registry = cfg.Transport, cfg.Registry
	c.Client.WaitForReady = wait
	return c
}

// A call that waits for an instance no server ever takes ends at its
// deadline, saying what it waited for and how the last try failed; one
// without a deadline ends after client.dial_timeout, saying so.
func TestWaitForReadyEndsAtTheDeadlineNamingTheLastDial(t *testing.T) {
	addr := fixedAddress(t, "tcp-lv")
	_, clientCfg := lonePair(t, testConfig(t), addr)
	clientCfg.Client.DialTimeout = kernel.Duration(300 * time.Millisecond)
	cli := newClient(t, clientCfg)
	// The deadline strikes during a pause, and then the error names the
	// refused dial; or, now and then, during a dial, and then it says so.
	waitedOut := func(err error) bool {
		msg := kernel.StatusOf(err).Message
		return kernel.CodeOf(err) == kernel.DeadlineExceeded &&
			(strings.Contains(msg, "waiting for "+addr+" to take the call (wait_for_ready); the last try: ") && strings.Contains(msg, "connection refused") ||
				strings.HasSuffix(msg, "passed while connecting to "+addr))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}, kernrpc.WaitForReady(true))
	if !waitedOut(err) {
		t.Errorf("call with a deadline: %v\nwant DeadlineExceeded naming wait_for_ready and the refused dial", err)
	}

	err = cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}, kernrpc.WaitForReady(true))
	msg := kernel.StatusOf(err).Message
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(msg, "connection refused") ||
		!strings.Contains(msg, "waited client.dial_timeout (300ms) for the instance to take the call (wait_for_ready)") {
		t.Errorf("call without a deadline: %v\nwant Unavailable after client.dial_timeout", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "1"}, kernrpc.WaitForReady(true))
	if !waitedOut(err) {
		t.Errorf("stream with a deadline: %v\nwant DeadlineExceeded naming wait_for_ready", err)
	}
}

// The call option overrides the config either way, and a call waiting
// for a server that is not there yet gets its answer once it starts.
func TestWaitForReadyOptionOverridesTheConfig(t *testing.T) {
	serverCfg, clientCfg := lonePair(t, testConfig(t), fixedAddress(t, "tcp-lv"))
	clientCfg.Client.WaitForReady = true
	cli := newClient(t, clientCfg)

	err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}, kernrpc.WaitForReady(false))
	if kernel.CodeOf(err) != kernel.Unavailable || strings.Contains(kernel.StatusOf(err).Message, "wait_for_ready") {
		t.Errorf("WaitForReady(false) on a waiting client: %v, want Unavailable at once", err)
	}

	answered := make(chan error, 2)
	go func() {
		answered <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "late"}, &echopb.Echo{})
	}()
	go func() {
		_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: "1"})
		answered <- err
	}()
	time.Sleep(150 * time.Millisecond) // both are waiting by now
	startServer(t, serverCfg, streamHandlers)
	for range 2 {
		if err := receive(t, answered, 5*time.Second, "the call and the stream waiting for the server"); err != nil {
			t.Errorf("a call waiting for a server that then started: %v", err)
		}
	}

	failing := newClient(t, testConfigLike(t, clientCfg, false))
	var resp echopb.Echo
	if err := failing.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "up"}, &resp, kernrpc.WaitForReady(true)); err != nil || resp.Text != "up" {
		t.Errorf("WaitForReady(true) on a client that fails fast, server up: %v, %q", err, resp.Text)
	}
}

// Closing the client ends a call waiting for readiness at once.
func TestCloseEndsACallWaitingForReadiness(t *testing.T) {
	_, clientCfg := lonePair(t, testConfig(t), fixedAddress(t, "tcp-lv"))
	clientCfg.Client.WaitForReady = true
	cli, err := kernrpc.NewClient(clientCfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}) }()
	time.Sleep(100 * time.Millisecond)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	err = receive(t, ended, 2*time.Second, "the waiting call to end once the client closed")
	if kernel.CodeOf(err) != kernel.Canceled || !strings.Contains(err.Error(), "is closed") {
		t.Errorf("waiting call after Close: %v, want Canceled saying the client is closed", err)
	}
}

func TestWaitForReadyIsReadFromTheConfigFile(t *testing.T) {
	cfg, err := kernrpc.LoadConfig(writeConfig(t, "svc.yaml", "client: {wait_for_ready: true, timeout: 3s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Client.WaitForReady || cfg.Client.Timeout.D() != 3*time.Second {
		t.Errorf("client = %+v, want wait_for_ready true and timeout 3s", cfg.Client)
	}
}
