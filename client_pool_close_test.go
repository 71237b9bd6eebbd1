package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A connection that heard a GoAway while a call or stream ran on it, and
// whose slot a new connection took for the next call, still belongs to
// the client: it counts as open, and Close ends the call or stream on it
// (Unavailable) and closes it, as it does those on every other
// connection, instead of leaving them to wait for an answer that may
// never come.
func TestCloseEndsCallsOnAConnectionReplacedAfterAGoAway(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold func(ctx context.Context, cli *kernrpc.Client) error
	}{
		{"call", func(ctx context.Context, cli *kernrpc.Client) error {
			return cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "held"}, &echopb.Echo{})
		}},
		{"stream", func(ctx context.Context, cli *kernrpc.Client) error {
			s, err := cli.NewStream(ctx, "Echo.Stream")
			if err != nil {
				return err
			}
			defer s.Close()
			return s.RecvMsg(&echopb.Echo{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testCloseEndsWorkOnAReplacedConnection(t, tc.hold) })
	}
}

func testCloseEndsWorkOnAReplacedConnection(t *testing.T, hold func(ctx context.Context, cli *kernrpc.Client) error) {
	ln := listenTCPLV(t)
	accepted := make(chan kernel.Conn, 2)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range 2 {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	cfg := testConfig(t)
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{ln.Addr()}}
	// No keepalive to end the held call: only Close may.
	cfg.Transport.Options = map[string]any{"keepalive_interval": "1h", "keepalive_timeout": "1h"}
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "client"}}
	cli := newClient(t, cfg)
	obs, _ := kernrpc.FindPlugin[*observer](cli.Plugins(), "test-observer")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The first call (or stream) reaches the server, which holds it, and
	// tells the connection it idled (the work crossed that GoAway: it is
	// served).
	first := make(chan error, 1)
	go func() { first <- hold(ctx, cli) }()
	a := receive(t, accepted, 5*time.Second, "the client did not dial")
	defer a.Close()
	for f := nextFrame(t, a); f.Type != kernel.FrameRequest; f = nextFrame(t, a) {
		f.Release() // a stream's window comes first
	}
	if err := a.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast, Message: "idle_timeout"}); err != nil {
		t.Fatal(err)
	}
	// The client's answer says it heard: the connection takes no new call.
	if f := nextFrame(t, a); f.Type != kernel.FrameGoAway {
		t.Fatalf("got %v; want the client's answer to the GoAway", f.Type)
	}
	// Read on (Pings are answered as they are read) until the client
	// closes the connection.
	aClosed := readUntilClosed(a)

	// The next call dials a new connection into the slot, and is served.
	second := make(chan error, 1)
	go func() {
		var resp echopb.Echo
		second <- cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "next"}, &resp)
	}()
	b := receive(t, accepted, 5*time.Second, "the client did not dial a new connection")
	defer b.Close()
	req := nextFrame(t, b)
	if err := b.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: req.CallID, Codec: req.Codec, Payload: req.Payload}); err != nil {
		t.Fatal(err)
	}
	req.Release()
	readUntilClosed(b)
	if err := receive(t, second, 5*time.Second, "the call on the new connection was not answered"); err != nil {
		t.Fatalf("call on the new connection: %v", err)
	}
	if n := obs.readings(t)["client_connections_open"].Value; n != 2 {
		t.Errorf("client_connections_open = %v with work running on the replaced connection, want 2", n)
	}

	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	err := receive(t, first, 5*time.Second, "Close left the work running on the connection the GoAway replaced")
	if code := kernel.CodeOf(err); code != kernel.Unavailable {
		t.Fatalf("the work Close ended: %v (code %v), want Unavailable", err, code)
	}
	receive(t, aClosed, 5*time.Second, "Close left the replaced connection open")
}

// readUntilClosed reads c, dropping what comes, on a goroutine of its own
// until c fails: the channel returned is closed then.
func readUntilClosed(c kernel.Conn) <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			f, err := c.ReadFrame(ctx)
			if err != nil {
				return
			}
			f.Release()
		}
	}()
	return closed
}
