package kernrpc

import (
	"context"
	"testing"
	"time"
)

// A GoAway steers calls away from its instance for a while, unless it
// came on a spare connection, one dialled to spread load: the server
// closes those when they idle, while the connections the calls keep to
// it serve on.
func TestGoAwayOnASpareConnectionKeepsTheInstance(t *testing.T) {
	p := &connPool{addr: "127.0.0.1:1", fixed: 1}
	(&clientConn{pool: p, spare: true}).serverGoingAway(7, true)
	if p.avoided() {
		t.Fatal("a GoAway on a spare connection passed its instance over")
	}
	(&clientConn{pool: p}).serverGoingAway(7, true)
	if !p.avoided() {
		t.Fatal("a GoAway on the pool's own connection did not pass its instance over")
	}
}

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
