package breaker

import (
	"math"
	"testing"
	"time"
)

// An entry whose open-until time lies far in the past (here the most
// negative int64, as a corrupt or foreign writer may leave) has expired:
// subtracting the wall clock from it must not wrap around into an opening
// that lasts centuries.
func TestPeerOpeningLongPastDoesNotWrap(t *testing.T) {
	r := sharedRig(t, nil)
	r.clock = time.Second
	r.peer(keyA, math.MinInt64, "another")
	r.wantState(hostA, Closed, "a peer's opening whose time is long past")
	if err := r.call(hostA, nil); err != nil {
		t.Fatalf("after an expired peer opening: %v, want the call through", err)
	}
}
