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
// with a frame waiting, the request goes out.
func TestARequestIsNotWrittenWhereThePeerHungUpWhileIdle(t *testing.T) {
	request := func() *kernel.Frame {
		return &kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Echo"}
	}
	idle := func() { time.Sleep(3 * quietAfter) }

	t.Run("closed", func(t *testing.T) {
		client, server := connPair(t, testOptions())
		server.Close()
		idle()
		err := client.WriteFrame(request())
		if !errors.Is(err, kernel.ErrPeerGone) || !strings.Contains(err.Error(), "not sent") {
			t.Fatalf("WriteFrame on a connection whose peer closed: %v; want ErrPeerGone saying the request was not sent", err)
		}
		if client.Err() == nil {
			t.Error("the connection found closed is not dead")
		}
	})
	t.Run("open", func(t *testing.T) {
		client, server := connPair(t, testOptions())
		idle()
		if err := client.WriteFrame(request()); err != nil {
			t.Fatalf("WriteFrame on an idle, open connection: %v", err)
		}
		f, err := server.ReadFrame(timeout(t, 5*time.Second))
		if err != nil || f.Type != kernel.FrameRequest {
			t.Fatalf("the server read %v, %v; want the request", f, err)
		}
		f.Release()
	})
	t.Run("half-closed", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("only Linux reads the TCP state")
		}
		// A draining server's end: it reads on, but serves no request
		// that comes after its FIN.
		client, server := connPair(t, testOptions())
		if err := server.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		idle()
		if err := client.WriteFrame(request()); !errors.Is(err, kernel.ErrPeerGone) {
			t.Fatalf("WriteFrame after the peer's half-close: %v; want ErrPeerGone", err)
		}
	})
	t.Run("closed behind a frame", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("only Linux reads the TCP state; elsewhere a peek sees the frame")
		}
		// A late answer or a GoAway, then the close: the server takes no
		// more requests, whatever waits unread before its FIN.
		client, server := connPair(t, testOptions())
		if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, Message: "test"}); err != nil {
			t.Fatal(err)
		}
		server.Close()
		idle()
		if err := client.WriteFrame(request()); !errors.Is(err, kernel.ErrPeerGone) {
			t.Fatalf("WriteFrame behind the peer's frame and close: %v; want ErrPeerGone", err)
		}
	})
	t.Run("a frame waiting", func(t *testing.T) {
		client, server := connPair(t, testOptions())
		if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameGoAway, Message: "test"}); err != nil {
			t.Fatal(err)
		}
		idle()
		if err := client.WriteFrame(request()); err != nil {
			t.Fatalf("WriteFrame with the peer's GoAway unread: %v; the reader must see the GoAway", err)
		}
		f, err := client.ReadFrame(timeout(t, 5*time.Second))
		if err != nil || f.Type != kernel.FrameGoAway {
			t.Fatalf("the client read %v, %v; want the GoAway", f, err)
		}
		f.Release()
	})
}
