package consultest_test

import (
	"testing"
	"time"
)

// After AbandonLeases the leader's session expires at the agent within
// session_ttl and another campaign wins; the old Leadership's Lost must
// then be closed ("Lost is closed when the leadership ends for any
// reason"), as the etcd registry's is.
func TestElectionAbandonedLeaderReportsLost(t *testing.T) {
	_, la, a, b := electA(t)
	a.AbandonLeases()
	lb, err := b.Campaign(ctx(t), "db-primary", "b")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Resign(ctx(t))
	select {
	case <-la.Lost():
	case <-time.After(sessionTTL):
		t.Fatal("b leads, yet a's Leadership.Lost is still open after its session expired")
	}
}
