package kernrpc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A connection reads one frame at a time on each side, so calls with large
// messages spread over a second connection once the one they would take
// has client.spread_bytes in flight; small calls stay together on one
// connection, and max_pool_size equal to pool_size never spreads.
func TestLargeCallsSpreadOverASecondConnection(t *testing.T) {
	for _, tc := range []struct {
		name        string
		payload     int
		maxPoolSize int // 0: the default
		wantConns   int // the server's connections after the calls
		wantPeers   int // connections the calls arrived on
	}{
		{"64KiB calls", 64 << 10, 0, 2, 2},
		{"16B calls", 16, 0, 1, 1},
		{"64KiB calls, max_pool_size 1", 64 << 10, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
			var mu sync.Mutex
			peers := map[string]int{}
			entered := make(chan struct{}, 8)
			release := make(chan struct{})
			srv := startServer(t, cfg, func(s *kernrpc.Server) {
				kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
					mu.Lock()
					peers[kernrpc.CallInfoFrom(ctx).Peer]++
					mu.Unlock()
					entered <- struct{}{}
					<-release
					return req, nil
				})
			})
			obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
			cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "client"}}
			cfg.Client.MaxPoolSize = tc.maxPoolSize
			cli := newClient(t, cfg)
			cliObs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")

			const calls = 4
			payload := bytes.Repeat([]byte{7}, tc.payload)
			errs := make(chan error, calls)
			for i := range calls {
				go func() {
					var resp echopb.Echo
					err := cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{Payload: payload}, &resp)
					if err == nil && !bytes.Equal(resp.Payload, payload) {
						err = kernel.Errorf(kernel.Internal, "answer of %d bytes, want the %d sent", len(resp.Payload), len(payload))
					}
					errs <- err
				}()
				// Each call waits in the handler before the next picks a
				// connection, so the load it sees is the calls before it.
				receive(t, entered, 5*time.Second, "call "+strconv.Itoa(i+1)+" did not reach the handler")
				if i == 1 && tc.wantConns == 2 {
					// The second call found the first connection loaded and
					// dialled another in the background: wait until the
					// client can pick it. The server accepts it before the
					// client has it in its pool, and a call meanwhile takes
					// the first connection without waiting for the dial.
					waitFor(t, func() bool { return cliObs.readings(t)["client_connections_open"].Value == 2 }, "a second connection")
				}
			}
			close(release)
			for range calls {
				if err := receive(t, errs, 5*time.Second, "a held call did not return"); err != nil {
					t.Fatal(err)
				}
			}
			if got := int(obs.readings(t)["server_connections_accepted_total"].Value); got != tc.wantConns {
				t.Errorf("the server accepted %d connections from one client, want %d", got, tc.wantConns)
			}
			rd := cliObs.readings(t)
			if open, spare := int(rd["client_connections_open"].Value), int(rd["client_connections_spare"].Value); open != tc.wantConns || spare != tc.wantConns-1 {
				t.Errorf("the client reads %d connections open, %d of them spare; want %d and %d", open, spare, tc.wantConns, tc.wantConns-1)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(peers) != tc.wantPeers {
				t.Errorf("%d calls arrived on %d connections (%v), want %d", calls, len(peers), peers, tc.wantPeers)
			}
		})
	}
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	if !eventually(5*time.Second, cond) {
		t.Fatalf("no %s within 5s", what)
	}
}

// eventually polls cond every millisecond for up to d and reports whether
// it came to hold: for what the server does after the client has its
// answer (counting, logging, closing), which a test can only wait for.
func eventually(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return cond()
		}
	}
	return true
}

// oneDialTCP is tcp-lv that refuses every dial after its first, as a
// server at its connection limit would.
type oneDialTCP struct {
	kernel.Transport
	dials atomic.Int32
}

func (o *oneDialTCP) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	if o.dials.Add(1) > 1 {
		return nil, errors.New("test: no second connection")
	}
	return o.Transport.Dial(ctx, addr)
}

var oneDial = &oneDialTCP{}

func init() {
	registerTCPWrapper("test-one-dial-tcp", "test: tcp-lv that dials once", &oneDial.Transport, oneDial)
}

// A dial to spread load that fails leaves the instance in service on the
// connection it has (it is not passed over as a dead instance would be),
// and is not tried again on every call that follows.
func TestFailedSpreadDialKeepsTheInstance(t *testing.T) {
	oneDial.dials.Store(0)
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-one-dial-tcp", nil
	entered := make(chan struct{}, 8)
	release := make(chan struct{})
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", holding(entered, release))
	})
	cli := newClient(t, cfg)
	errs := holdTwoLarge(t, cli, entered)
	payload := make([]byte, 64<<10)
	// The second call found the connection loaded and started a dial,
	// which fails. While the held calls keep it loaded, more calls go
	// through on it, with no dial of their own: until that dial is done
	// its slot is taken, and after, spreading is held off.
	waitFor(t, func() bool { return oneDial.dials.Load() == 2 }, "spreading dial")
	for i := range 5 {
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Payload: payload}, &resp); err != nil || len(resp.Payload) != len(payload) {
			t.Fatalf("call %d after the failed spreading dial: %v", i, err)
		}
	}
	close(release)
	for range 2 {
		if err := receive(t, errs, 5*time.Second, "a held call did not return"); err != nil {
			t.Fatal(err)
		}
	}
	if n := oneDial.dials.Load(); n != 2 {
		t.Errorf("%d dials; want the first and one failed spreading dial", n)
	}
}

// A spare connection the client dialled and then left silent is closed by
// the server after tcp-lv's first_frame_timeout; the client learns it only
// when it next reads there. A call it wrote there meanwhile was never
// served, and the server says so (a GoAway naming no call served): the
// call is sent again, not failed as lost. A stream opened there is
// opened again (its opening write mostly fails at once, on the server's
// reset; TestStreamOpenRetriedWhenTheServersGoAwaySaysItWasNotServed
// orders the GoAway first).
func TestWorkOnASpareTheServerClosedForSilenceIsSentAgain(t *testing.T) {
	for _, last := range []string{"call", "stream"} {
		t.Run(last, func(t *testing.T) { testWorkOnAClosedSpare(t, last) })
	}
}

func testWorkOnAClosedSpare(t *testing.T, last string) {
	cfg := testConfig(t)
	cfg.Transport.Options["first_frame_timeout"] = "200ms"
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
	entered := make(chan struct{}, 8)
	release := make(chan struct{}, 8)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		streamHandlers(s)
		kernrpc.Handle(s, "Echo.Hold", holding(entered, release))
	})
	obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "client"}}
	cli := newClient(t, cfg)
	cliObs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")

	payload := bytes.Repeat([]byte{7}, 64<<10)
	errs := make(chan error, 4)
	hold := func(what string) {
		go func() {
			var resp echopb.Echo
			errs <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{Payload: payload}, &resp)
		}()
		select {
		case <-entered:
		case err := <-errs:
			t.Fatalf("%s failed: %v", what, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not reach the handler within 5s", what)
		}
	}
	answer := func(n int) {
		for range n {
			release <- struct{}{}
		}
		for range n {
			if err := receive(t, errs, 5*time.Second, "a held call did not return"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The second of two held calls finds the first connection loaded and
	// dials a spare, which then carries nothing.
	hold("the first call")
	hold("the second call")
	waitFor(t, func() bool { return cliObs.readings(t)["client_connections_spare"].Value == 1 }, "spare connection")
	answer(2)
	waitFor(t, func() bool { return obs.readings(t)["server_connections_open"].Value == 1 }, "spare closed by the server")

	// The client has not read the spare since: it still counts it open,
	// and work that finds the first connection loaded is written there.
	hold("a call on the first connection")
	if last == "call" {
		hold("a call sent to the closed spare, then again")
		answer(2)
		return
	}
	upOnAClosedSpare(t, cli)
	answer(1)
}

// upOnAClosedSpare opens Count.Up, which the client writes on a spare the
// server has closed, and reads it through: it must have been opened again
// or end retryable.
func upOnAClosedSpare(t *testing.T, cli *kernrpc.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3"})
	n := 0
	for err == nil {
		if _, err = st.Recv(); err == nil {
			n++
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		if n != 3 {
			t.Errorf("the stream brought %d messages, want 3", n)
		}
	case !kernel.IsRetryable(err):
		t.Errorf("the stream on the closed spare ended %v, not retryable; the server never opened it", err)
	default:
		t.Logf("the stream ended retryable: %v", err)
	}
}

// holdTwoLarge makes two 64 KiB calls of Echo.Hold (see holding), one
// after the other has reached the handler, and returns where their
// errors will come: the second finds the connection loaded.
func holdTwoLarge(t *testing.T, cli *kernrpc.Client, entered <-chan struct{}) <-chan error {
	t.Helper()
	payload := make([]byte, 64<<10)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			errs <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{Payload: payload}, &echopb.Echo{})
		}()
		receive(t, entered, 5*time.Second, "held call "+strconv.Itoa(i+1)+" did not reach the handler")
	}
	return errs
}
