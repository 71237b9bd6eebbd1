//go:build linux || darwin

package tcplv

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A request about to be written on a connection that nobody has read since
// it idled looks for the peer's close first: written after it, the request
// would be lost with the connection though no server ever read it. Found
// closed, the request is not sent and the write says so; found open, or
// with a frame waiting, the request goes out, and the frame is still read.
func TestARequestIsNotWrittenWhereThePeerHungUpWhileIdle(t *testing.T) {
	goAway := func(server *conn) error {
		return server.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, Message: "test"})
	}
	for _, tc := range []struct {
		name      string
		linuxOnly string // why the case needs Linux's TCP state, if it does
		peer      func(server *conn) error
		framed    bool // the peer wrote a GoAway first
		sent      bool
	}{
		{"closed", "", func(s *conn) error { return s.Close() }, false, false},
		{"open", "", func(*conn) error { return nil }, false, true},
		// A draining server's end: it reads on, but serves no request that
		// comes after its FIN.
		{"half-closed", "only Linux reads the TCP state", func(s *conn) error { return s.CloseWrite() }, false, false},
		// A late answer or a GoAway, then the close: the server takes no
		// more requests, whatever waits unread before its FIN.
		{"closed behind a frame", "only Linux reads the TCP state; elsewhere a peek sees the frame",
			func(s *conn) error { return errors.Join(goAway(s), s.Close()) }, true, false},
		{"a frame waiting", "", goAway, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.linuxOnly != "" && runtime.GOOS != "linux" {
				t.Skip(tc.linuxOnly)
			}
			client, server := connPair(t, testOptions())
			if err := tc.peer(server); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * quietAfter)
			err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Echo"})
			if !tc.sent {
				if !errors.Is(err, kernel.ErrPeerGone) || !strings.Contains(err.Error(), "not sent") {
					t.Fatalf("WriteFrame on a connection its peer closed: %v; want ErrPeerGone saying the request was not sent", err)
				}
				if client.Err() == nil {
					t.Error("the connection found closed is not dead")
				}
				return
			}
			if err != nil {
				t.Fatalf("WriteFrame on an idle, open connection: %v", err)
			}
			wantRead(t, server, kernel.FrameRequest)
			if tc.framed {
				wantRead(t, client, kernel.FrameGoAway) // the look consumed nothing
			}
		})
	}
}

// wantRead reads one frame on c, which must be of type want.
func wantRead(t *testing.T, c *conn, want kernel.FrameType) {
	t.Helper()
	f, err := c.ReadFrame(timeout(t, 5*time.Second))
	if err != nil || f.Type != want {
		t.Fatalf("read %v, %v; want a %v", f, err, want)
	}
	f.Release()
}

// TestCloseRacingAGoAwayFlushStillClosesTheConnection: the frame clock
// ends a silent accepted connection with a GoAway, whose flush waits for a
// write in flight to a peer that does not read. A Close meanwhile must
// still close the connection before it returns: Done closed, the socket
// shut, the blocked write failed.
func TestCloseRacingAGoAwayFlushStillClosesTheConnection(t *testing.T) {
	o := testOptions()
	o.MaxFrameSize = 64 << 20
	o.MaxWriteQueue = 128 << 20
	o.FirstFrameTimeout = kernel.Duration(200 * time.Millisecond)
	raw, server := rawPair(t, o)
	_ = raw // reads and sends nothing
	wrote := make(chan error, 1)
	go func() {
		// Far more than loopback buffers: this direct write blocks.
		payload := make([]byte, 48<<20)
		wrote <- server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: payload})
	}()
	// The first-frame clock runs out at 200ms, queues its GoAway and waits
	// for the write in flight (cut to end within a second).
	time.Sleep(400 * time.Millisecond)
	if server.Err() == nil {
		t.Fatal("first_frame_timeout did not end the connection; nothing was tested")
	}
	start := time.Now()
	server.Close()
	returned := time.Since(start)
	select {
	case <-server.Done():
	default:
		t.Errorf("Close returned after %v, and Done is not closed", returned)
	}
	// The write failed before Close returned; give it a moment to report.
	select {
	case err := <-wrote:
		t.Logf("the blocked write ended: %v", err)
	case <-time.After(100 * time.Millisecond):
		t.Errorf("Close returned after %v with a WriteFrame still blocked on the socket", returned)
		<-wrote
	}
}
