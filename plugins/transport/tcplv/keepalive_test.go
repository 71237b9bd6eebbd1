package tcplv

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func keepaliveOptions(interval, timeout time.Duration) *Options {
	o := testOptions()
	o.KeepaliveInterval = kernel.Duration(interval)
	o.KeepaliveTimeout = kernel.Duration(timeout)
	return o
}

// dialSilentPeer dials, with o, a bare TCP listener whose accepted
// socket it returns: nothing answers there unless the test writes to it.
func dialSilentPeer(t *testing.T, o *Options) (*conn, net.Conn) {
	t.Helper()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hole.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, _ := hole.Accept()
		accepted <- nc
	}()
	c := dial(t, newTransport(t, o), hole.Addr().String())
	peer := <-accepted
	if peer == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// TestBlackholedPeerIsDetectedWhileACallWaits: the peer's TCP stack
// accepts and acknowledges, but nothing ever answers.
func TestBlackholedPeerIsDetectedWhileACallWaits(t *testing.T) {
	const interval, keepaliveTimeout = 50 * time.Millisecond, 100 * time.Millisecond
	c, _ := dialSilentPeer(t, keepaliveOptions(interval, keepaliveTimeout))

	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Say"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.ReadFrame(timeout(t, 10*time.Second))
	elapsed := time.Since(start)
	if !errors.Is(err, kernel.ErrPeerGone) || !strings.Contains(err.Error(), "no answer to keepalive within 100ms") {
		t.Fatalf("ReadFrame: %v, want peer gone: no answer to keepalive", err)
	}
	if bound := interval + keepaliveTimeout + 100*time.Millisecond; elapsed > bound {
		t.Fatalf("detected after %v, want within %v", elapsed, bound)
	}
	if !errors.Is(c.Err(), kernel.ErrPeerGone) {
		t.Fatalf("Err: %v", c.Err())
	}
}

// TestKeepaliveKillsNoConnectionThatExpectsNothing: with no request
// waiting for an answer, no side probes, whoever reads: an idle client
// with nobody reading survives its own keepalive and the server's, whose
// read loop always waits.
func TestKeepaliveKillsNoConnectionThatExpectsNothing(t *testing.T) {
	cases := []struct {
		name                     string
		clientReads, serverReads bool
	}{
		{"nobody reads", false, false},
		{"the server reads, the client is idle", false, true},
		{"the client reads without a request out", true, false},
		{"both read", true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client, server := connPair(t, keepaliveOptions(10*time.Millisecond, 10*time.Millisecond))
			reads := make(chan error, 2)
			for _, r := range []struct {
				c    *conn
				read bool
			}{{client, tc.clientReads}, {server, tc.serverReads}} {
				if r.read {
					go func() {
						f, err := r.c.ReadFrame(context.Background())
						if err == nil {
							f.Release()
						}
						reads <- err
					}()
				}
			}
			time.Sleep(300 * time.Millisecond)
			if client.Err() != nil || server.Err() != nil {
				t.Fatalf("keepalive killed an idle connection: client %v, server %v", client.Err(), server.Err())
			}
			client.Close()
			server.Close()
			if tc.clientReads {
				<-reads
			}
			if tc.serverReads {
				<-reads
			}
		})
	}
}

// TestSlowButLivePeerIsNotKilled: the server takes many keepalive periods
// to answer, but its reader answers the Pings meanwhile.
func TestSlowButLivePeerIsNotKilled(t *testing.T) {
	client, server := connPair(t, keepaliveOptions(10*time.Millisecond, 20*time.Millisecond))
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	req, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	req.Release()
	asked := int64(time.Since(clockBase)) // the client has heard nothing since its request
	var heard atomic.Int64
	serverReads := make(chan error, 1)
	go func() {
		_, err := server.ReadFrame(context.Background())
		serverReads <- err
	}()
	time.AfterFunc(300*time.Millisecond, func() {
		heard.Store(client.lastRecv.Load())
		server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1})
	})
	resp, err := client.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("a slow but live peer was declared dead: %v", err)
	}
	resp.Release()
	if since := time.Duration(heard.Load() - asked); since < 100*time.Millisecond {
		t.Fatalf("the client last heard from the server %v into a 300ms wait: the Pings were not answered throughout, so nothing was tested", since)
	}
	client.Close()
	if err := <-serverReads; !errors.Is(err, kernel.ErrPeerGone) {
		t.Fatalf("server's read after the client closed: %v", err)
	}
}

// TestKeepaliveTimerComesWithTheFirstRequest: keepalive probes only while
// requests wait for answers, so a connection that has written none (a
// server's) has no timer, and the first request written starts it.
func TestKeepaliveTimerComesWithTheFirstRequest(t *testing.T) {
	client, server := connPair(t, testOptions())
	hasTimer := func(c *conn) bool { return c.kaTimer.Load() != nil }
	if hasTimer(client) || hasTimer(server) {
		t.Fatalf("keepalive timer made before any request (client %v, server %v)", hasTimer(client), hasTimer(server))
	}
	if err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "M"}); err != nil {
		t.Fatal(err)
	}
	f, err := server.ReadFrame(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.Release()
	if err := server.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if !hasTimer(client) {
		t.Errorf("no keepalive timer on the client after its first request")
	}
	if hasTimer(server) {
		t.Errorf("a keepalive timer on the server, which wrote only a response")
	}
}

// TestAPeerThatDiesAfterSpeakingIsDetectedWithinIntervalPlusTimeout:
// the peer sends something just after a keepalive run, then dies (stays
// connected, answers nothing, not even Pings). The package doc and
// docs/protocol.md promise a Ping once nothing has arrived for
// keepalive_interval and death keepalive_timeout after it: within
// interval+timeout of the last byte.
func TestAPeerThatDiesAfterSpeakingIsDetectedWithinIntervalPlusTimeout(t *testing.T) {
	// Before the fix this schedule had it declared dead 1.25 s after its
	// last frame, against 0.7 s now: the slack takes a loaded machine.
	const interval, kaTimeout = 600 * time.Millisecond, 100 * time.Millisecond
	c, peer := dialSilentPeer(t, keepaliveOptions(interval, kaTimeout))

	t0 := time.Now()
	if err := c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Say"}); err != nil {
		t.Fatal(err)
	}
	lastSent := make(chan time.Time, 1)
	go func() {
		// Stream messages for the waiting call: signs of life that
		// answer nothing, so the request stays unanswered.
		msg := encode(&kernel.Frame{Type: kernel.FrameStreamData, CallID: 1, Payload: []byte("x")})
		time.Sleep(time.Until(t0.Add(interval / 2)))
		peer.Write(msg)
		time.Sleep(time.Until(t0.Add(interval + 50*time.Millisecond)))
		peer.Write(msg)
		lastSent <- time.Now()
		// Then the peer's process hangs: nothing more, no Pong.
	}()
	ctx := timeout(t, 10*time.Second)
	for {
		f, err := c.ReadFrame(ctx)
		if err != nil {
			if !errors.Is(err, kernel.ErrPeerGone) {
				t.Fatalf("ReadFrame: %v; want peer gone", err)
			}
			break
		}
		f.Release()
	}
	silent := time.Since(<-lastSent)
	if bound := interval + kaTimeout + 250*time.Millisecond; silent > bound {
		t.Fatalf("a peer silent since its last frame was declared dead %v later; keepalive_interval+keepalive_timeout is %v (bound with slack %v)",
			silent.Round(time.Millisecond), interval+kaTimeout, bound)
	}
}
