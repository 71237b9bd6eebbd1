package kernrpc_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A stream whose first pick is an instance that refuses connections is
// opened on another: its opening is retried as a call's is.
func TestStreamOpenPassesOverADeadInstance(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, streamHandlers)
	cli := staticClient(t, cfg, deadAddress(t), srv.Addr())
	second := 0
	for i := range 6 {
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: "3"})
		if err != nil {
			t.Fatalf("stream %d: %v; want it opened on the live instance", i, err)
		}
		if err := readCount(st, 3); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		info := st.Info()
		if info.Peer != srv.Addr() {
			t.Errorf("stream %d went to %s; want the live %s", i, info.Peer, srv.Addr())
		}
		if info.Attempt == 2 {
			second++
		}
	}
	if second == 0 {
		t.Errorf("no stream was opened on a second attempt; the dead instance was never picked, so this test checked nothing")
	}
}

// With every instance dead, opening a stream fails with Unavailable
// naming the address, after the configured retries, and does not hang.
func TestStreamOpenWithEveryInstanceDead(t *testing.T) {
	cfg := testConfig(t)
	dead := deadAddress(t)
	cli := staticClient(t, cfg, dead)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3"})
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), dead) {
		t.Fatalf("open: %v; want Unavailable naming %s", err, dead)
	}
	if ctx.Err() != nil {
		t.Errorf("open failed only once its context ended (%v); a refused dial must fail it at once", err)
	}
}

// A registry with no instance of the service fails the opening with the
// advice a call gets, once the context's deadline passes.
func TestStreamOpenWithNoInstance(t *testing.T) {
	cfg := testConfig(t)
	cli := newClient(t, cfg) // nothing serves echo in this namespace
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3"})
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), `no instance of "echo" to call Count.Up`) {
		t.Fatalf("open: %v; want Unavailable saying no instance of echo was found", err)
	}
}

// A stream whose deadline passed before it was opened is not sent: the
// server never sees it, and the caller gets DeadlineExceeded saying when.
// Nor is one whose context was cancelled: it gets Canceled.
func TestStreamOpenAfterItsDeadline(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		t.Run("cancelled="+strconv.FormatBool(cancelled), func(t *testing.T) {
			cfg := testConfig(t)
			var opened atomic.Int32
			startServer(t, cfg, func(s *kernrpc.Server) {
				// Untyped: counted before it reads anything, which a
				// Cancel following the opening would fail.
				mustRegisterStream(s, "Count.Up", kernel.ServerStreaming, func(context.Context, *kernrpc.ServerStream) error {
					opened.Add(1)
					return nil
				})
			})
			cli := newClient(t, cfg)
			// One call first, so that the connection is up and the
			// context, not a dial, is what the opening meets.
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
			want := kernel.DeadlineExceeded
			if cancelled {
				ctx, cancel = context.WithCancel(context.Background())
				cancel()
				want = kernel.Canceled
			}
			defer cancel()
			_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "1"})
			if kernel.CodeOf(err) != want {
				t.Fatalf("open: %v; want %v", err, want)
			}
			// The stream would have reached the server with the call below.
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
				t.Fatal(err)
			}
			if n := opened.Load(); n != 0 {
				t.Errorf("the server ran the handler of a stream opened after its context ended %d times; want none", n)
			}
		})
	}
}

// An opening the transport refuses alone (metadata over its limit) fails
// with the transport's status, and the connection serves on.
func TestStreamOpenRefusedByTheTransport(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Options["max_metadata_entries"] = 4
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	md := kernel.Metadata{}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		md[k] = "v"
	}
	_, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: "1"}, kernrpc.CallMetadata(md))
	if kernel.CodeOf(err) != kernel.ResourceExhausted || !strings.Contains(err.Error(), "max_metadata_entries 4") {
		t.Fatalf("open with 5 metadata entries: %v; want ResourceExhausted naming max_metadata_entries", err)
	}
	recvAll(t, cli, 2) // the connection still serves
}
