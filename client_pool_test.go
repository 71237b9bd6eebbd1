package kernrpc

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A GoAway steers calls away from its instance for a while, unless it
// came on a spare connection, one dialled to spread load (the server
// closes those when they idle, while the connections the calls keep to
// it serve on), or gave a reason that ends its connection only.
func TestGoAwayOnASpareConnectionKeepsTheInstance(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spare   bool
		goAway  *kernel.Frame
		avoided bool
	}{
		{"shutting down, on a spare", true, &kernel.Frame{Type: kernel.FrameGoAway, CallID: 7}, false},
		{"shutting down", false, &kernel.Frame{Type: kernel.FrameGoAway, CallID: 7}, true},
		{"an answer saying it drains", false, nil, true},
		{"idle_timeout", false, &kernel.Frame{Type: kernel.FrameGoAway, CallID: 7, Message: idleTimeoutReason}, false},
		{"first_frame_timeout", false, &kernel.Frame{Type: kernel.FrameGoAway, Message: "first_frame_timeout"}, false},
		{"too_many_pings", false, &kernel.Frame{Type: kernel.FrameGoAway, CallID: kernel.GoAwayUnknownLast, Message: "too_many_pings"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &connPool{addr: "127.0.0.1:1", fixed: 1}
			(&clientConn{conn: closableConn{}, pool: p, spare: tc.spare}).serverGoingAway(tc.goAway)
			if p.avoided() != tc.avoided {
				t.Fatalf("the instance passed over: %v, want %v", p.avoided(), tc.avoided)
			}
		})
	}
}

// closableConn is a connection that can only be closed: an idle
// connection that hears a GoAway closes itself.
type closableConn struct{ kernel.Conn }

func (closableConn) Close() error { return nil }

// pastDeadline is a context whose deadline has passed but whose timer has
// not run yet: Err is still nil, as a context.WithDeadline's is for a
// moment after its deadline.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A dial that fails by the deadline its context carried, a moment before
// the caller's context reads as done, is the caller's giving up, not the
// instance's failure: ended sees the deadline itself.
func TestEndedSeesAPassedDeadlineBeforeItsTimer(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"live", context.Background(), false},
		{"deadline passed, timer not run", pastDeadline{context.Background()}, true},
		{"canceled", canceledContext(), true},
	} {
		if got := ended(tc.ctx); got != tc.want {
			t.Errorf("%s: ended = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// The pauses of a call waiting for readiness grow from firstReadyPause to
// maxReadyPause and no further, each within ±20%.
func TestReadyPausesGrowToTheirBound(t *testing.T) {
	for n, want := range map[int]time.Duration{0: firstReadyPause, 1: 32 * time.Millisecond, 5: 209715200 /* 20ms × 1.6⁵ */, 12: maxReadyPause, 1000: maxReadyPause} {
		for range 50 {
			if got := readyPause(n); got < want*8/10 || got > want*12/10 {
				t.Fatalf("readyPause(%d) = %s, want %s ±20%%", n, got, want)
			}
		}
	}
}

// A spare connection speaks for no instance: as its failed dial does not
// pass the instance over, its dial that connects does not end a pass
// over one that said it shuts down (a spreading dial under way when the
// GoAway came, which the draining server accepted all the same).
func TestASpareDialDoesNotEndAGoAwaysPassOver(t *testing.T) {
	c := &Client{cfg: DefaultConfig()}
	p := &connPool{client: c, addr: "127.0.0.1:1", fixed: 1, conns: make([]*clientConn, 2), dialing: make([]*pendingDial, 2)}
	(&clientConn{conn: closableConn{}, pool: p}).serverGoingAway(&kernel.Frame{Type: kernel.FrameGoAway, CallID: 7})
	if !p.avoided() {
		t.Fatal("the instance is not passed over after its GoAway")
	}
	d := &pendingDial{done: make(chan struct{})}
	p.dialing[1] = d
	c.dials.Add(1)
	p.settle(1, d, closableConn{}, nil)
	if d.err != nil || p.conns[1] == nil {
		t.Fatalf("the spare's dial did not settle into its slot: %v", d.err)
	}
	if !p.avoided() {
		t.Fatal("the instance is no longer passed over once a spare connected: calls go back to an instance shutting down")
	}
}

// An instance's pool moves to the retired ones when it leaves the
// registry, its connections still carrying calls: the client's figures,
// read as it moves, count its connections once, not in both places.
func TestConnectionsOfAPoolRetiringAreCountedOnce(t *testing.T) {
	c := &Client{cfg: DefaultConfig(), service: "echo"}
	p := &connPool{client: c, addr: "127.0.0.1:1", fixed: 1, conns: make([]*clientConn, 1), dialing: make([]*pendingDial, 1), endLife: func() {}}
	p.conns[0] = &clientConn{conn: closableConn{}, pool: p, pending: map[uint64]*attempt{1: {}}} // a call in flight keeps it open
	none := map[string]*connPool{}
	c.pools.Store(&none)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.poolsMu.Lock()
			c.pools.Store(&map[string]*connPool{p.addr: p}) // listed again
			delete(c.retired, p)
			c.poolsMu.Unlock()
			c.dropPoolsNotIn(nil) // and gone
		}
	}()
	defer func() { close(stop); <-done }()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		clientState{c}.ReportState(func(r kernel.Reading) {
			if r.Name == "client_connections_open" && r.Value > 1 {
				t.Fatalf("client_connections_open = %v with one connection open: a pool retiring as the figures are read is counted twice", r.Value)
			}
		})
	}
}

// A refused dial passes an instance over for a second, a shutdown GoAway
// for five; the shorter span, started later, does not cut the longer one
// short (a server shutting down refuses the dials calls still try).
func TestAShorterPassOverDoesNotCutALongerOneShort(t *testing.T) {
	p := &connPool{}
	p.markDown(goAwayAvoidance)
	p.markDown(dialAvoidance)
	if left := time.Until(time.Unix(0, p.down.until.Load())); left < goAwayAvoidance-time.Second {
		t.Fatalf("after a GoAway's %s pass over and a refused dial's %s, the instance is passed over for %s more; want the GoAway's",
			goAwayAvoidance, dialAvoidance, left.Round(time.Millisecond))
	}
}
