//go:build linux

package shmring

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The peer's process dies (no end record) with a frame still unread: the
// watcher leaves the connection to the reader. Once the reader took that
// last frame, nothing is unread and nobody reads, yet the connection
// never dies: Done stays open and the segment stays mapped until the
// connection's next use. The same happens when the socket closes while a
// ReadFrame is on its way out with a frame (the watcher's TryLock fails).
func TestAConnectionWhosePeerIsGoneDiesOnceItsLastFrameIsRead(t *testing.T) {
	c, s := connPair(t, testOptions())
	send(t, c, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1}, pattern(100, 1))
	c.die(slog.LevelDebug, errors.New("process killed")) // closes the socket, no end record
	deadline := time.Now().Add(2 * time.Second)
	for !s.peerGone.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !s.peerGone.Load() {
		t.Fatal("the watcher did not see the peer's socket close")
	}
	f := recv(t, s)
	f.Release()
	select {
	case <-s.Done():
	case <-time.After(time.Second):
		t.Fatal("peer gone, nothing left unread, nobody reading: the connection never died")
	}
}
