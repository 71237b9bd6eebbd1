package kernrpc

import "testing"

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
