package kernrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"google.golang.org/protobuf/proto"
)

// fakeServer accepts one tcp-lv connection and answers each frame it
// reads with the frames answer makes of it (none: no answer; hangUp
// among them: it closes the connection there).
func fakeServer(t *testing.T, answer func(f *kernel.Frame) []*kernel.Frame) string {
	t.Helper()
	ln := listenTCPLV(t)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			f, err := c.ReadFrame(ctx)
			if err != nil {
				return
			}
			for _, out := range answer(f) {
				if out == hangUp {
					f.Release()
					return
				}
				if c.WriteFrame(out) != nil {
					break
				}
			}
			f.Release()
		}
	}()
	return ln.Addr()
}

// hangUp, among the frames a fakeServer's answer returns, makes it close
// the connection instead of writing on.
var hangUp = &kernel.Frame{}

// listenTCPLV listens on a free loopback port with tcp-lv, for a test
// that plays the server with the transport alone; the listener closes
// when t ends.
func listenTCPLV(t *testing.T) kernel.Listener {
	t.Helper()
	tr, err := kernel.NewTransport("tcp-lv", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tr.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// A server that breaks the stream protocol (more data than the client's
// window allows, or data for a stream the connection never opened) gets
// its connection closed, with the reason logged at WARN; the client's
// open streams end with Unavailable naming it.
func TestClientClosesAServerThatBreaksTheStreamProtocol(t *testing.T) {
	msg, err := proto.Marshal(&echopb.Echo{Payload: make([]byte, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		stream bool // open a stream, else make a call
		answer func(id uint64) []*kernel.Frame
		want   string
	}{
		{"beyond credit", true, func(id uint64) []*kernel.Frame {
			var fs []*kernel.Frame
			for range 4 {
				fs = append(fs, &kernel.Frame{Type: kernel.FrameStreamData, CallID: id, Payload: msg})
			}
			return fs
		}, "the server sent stream data beyond the credit it was granted"},
		{"data for no stream", false, func(id uint64) []*kernel.Frame {
			return []*kernel.Frame{{Type: kernel.FrameStreamData, CallID: id, Payload: msg}}
		}, "the server sent stream data on a connection with no stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := enginetest.DefaultLog(t)
			addr := fakeServer(t, func(f *kernel.Frame) []*kernel.Frame {
				if f.Type != kernel.FrameRequest { // a call or a stream's opening
					return nil
				}
				return tc.answer(f.CallID)
			})
			cfg := testConfig(t)
			cfg.Streams.Window = 1 << 10
			cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
			cli := newClient(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var m echopb.Echo
			const warned = `level=WARN msg="closing a connection whose server broke the stream protocol"`
			if tc.stream {
				// The flood may come before the open returns: the stream's
				// request went out, so the open then fails with the breach
				// (seen on a busy machine); else the stream's reads do.
				st, err := cli.NewStream(ctx, "Flood.Out")
				if err == nil {
					// Nothing is read until the breach is seen: a read
					// would grant credit back, and a flood that arrived
					// after the grant would be within it.
					if !eventually(5*time.Second, func() bool { return strings.Contains(logs.String(), warned) }) {
						t.Fatalf("the flood beyond the window was not seen:\n%s", logs.String())
					}
					for err == nil {
						err = st.RecvMsg(&m)
					}
				}
				if kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("NewStream or RecvMsg: %v; want Unavailable naming %q", err, tc.want)
				}
			} else if err := cli.Call(ctx, "Echo.Echo", &m, &m); kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Call: %v; want Unavailable naming %q", err, tc.want)
			}
			if !strings.Contains(logs.String(), warned) {
				t.Errorf("nothing logged at WARN:\n%s", logs.String())
			}
		})
	}
}
