package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// idleLonger is longer than a connection takes to get its idle reader
// (two of the client's looks, 100 ms apart), with room for a busy machine.
const idleLonger = 400 * time.Millisecond

// A client whose connection carries no call still reads it: it answers a
// server's GoAway with its count and closes the connection, without a
// call to read them. Before, the GoAway lay unread until the next call,
// and a shutdown waited a second for the answer and another for the close.
func TestAnIdleClientAnswersAGoAwayAndCloses(t *testing.T) {
	for _, reason := range []string{"", "idle_timeout"} {
		t.Run("reason="+reason, func(t *testing.T) {
			ln := listenTCPLV(t)
			accepted := make(chan kernel.Conn, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if c, err := ln.Accept(ctx); err == nil {
					accepted <- c
				}
			}()

			cfg := testConfig(t)
			cfg.Registry.Options["static"] = map[string]any{"echo": []any{ln.Addr()}}
			cli := newClient(t, cfg)
			// Two calls: a client that made one may be one made for it
			// alone, and is not looked after (clientconn_idle.go).
			done := make(chan error, 1)
			go func() {
				var resp echopb.Echo
				for range 2 {
					if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &resp); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			c := receive(t, accepted, 5*time.Second, "the client did not dial")
			defer c.Close()
			for range 2 {
				req := nextFrame(t, c)
				if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: req.CallID, Codec: req.Codec, Payload: req.Payload}); err != nil {
					t.Fatal(err)
				}
				req.Release()
			}
			if err := receive(t, done, 5*time.Second, "the calls were not answered"); err != nil {
				t.Fatalf("call: %v", err)
			}

			// Idle now, with nobody calling, the client hears the GoAway.
			time.Sleep(idleLonger)
			if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast, Message: reason}); err != nil {
				t.Fatal(err)
			}
			f, err := readFrame(t, c, 5*time.Second)
			if err != nil {
				t.Fatalf("an idle client did not answer the GoAway: %v", err)
			}
			if f.Type != kernel.FrameGoAway || f.CallID != 2 {
				t.Fatalf("got %v (call id %d); want the client's GoAway counting the 2 requests it sent", f.Type, f.CallID)
			}
			f.Release()
			if f, err := readFrame(t, c, 5*time.Second); err == nil {
				t.Fatalf("got %v (call id %d) where the client should have closed the connection", f.Type, f.CallID)
			} else if !isClosed(c) {
				t.Fatalf("the client did not close the connection after answering: %v", err)
			}
		})
	}
}

// isClosed reports whether c's peer closed it.
func isClosed(c kernel.Conn) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// The idle reader gives way to the next call and the next stream: each
// reads its own answer as before, over either transport.
func TestCallsAndStreamsAfterIdlingAreServed(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		startServer(t, cfg, streamHandlers)
		cli := newClient(t, cfg)
		for i := range 3 {
			var resp echopb.Echo
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &resp); err != nil || resp.Text != "x" {
				t.Fatalf("call %d after idling: %q, %v", i, resp.Text, err)
			}
			time.Sleep(idleLonger)
			st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: "3"})
			if err != nil {
				t.Fatalf("stream %d after idling: %v", i, err)
			}
			for j := 0; ; j++ {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) && j == 3 {
					break
				}
				if err != nil || m.Text != strconv.Itoa(j) {
					t.Fatalf("stream %d after idling, message %d: %v, %v", i, j, m, err)
				}
			}
			time.Sleep(idleLonger)
		}
	})
}
