package consultest_test

import (
	"testing"
	"time"
)

// TestElectionLostLeadershipStopsItsRequests: a leadership that ends on its
// own (here its lock was deleted from under it, as an operator's `consul kv
// delete` would) closes Lost, and then stops renewing its session and
// querying its key: nobody is going to call Resign on a leadership that is
// over, and until the registry closes its goroutines would run on, keeping
// alive a session that holds nothing.
func TestElectionLostLeadershipStopsItsRequests(t *testing.T) {
	s, la, _, _ := electA(t)
	if _, err := apiClient(t, s.Addr()).KV().Delete("kernrpc/elections/db-primary", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Lost():
	case <-time.After(2 * sessionTTL):
		t.Fatal("a's Lost() open after its lock was deleted")
	}
	time.Sleep(sessionTTL / 2) // what was in flight ends
	renews, gets := s.Requests("PUT /v1/session/renew"), s.Requests("GET /v1/kv")
	time.Sleep(2 * sessionTTL)
	if n := s.Requests("PUT /v1/session/renew") - renews; n > 0 {
		t.Errorf("%d session renewals in %s after the leadership was lost; want none", n, 2*sessionTTL)
	}
	if n := s.Requests("GET /v1/kv") - gets; n > 0 {
		t.Errorf("%d key queries in %s after the leadership was lost; want none", n, 2*sessionTTL)
	}
}

// TestElectionGivenUpLeadershipStopsQueryingItsKey: a leader that gave up
// because the agent did not answer (Lost closed) does not query its key on
// and on once the agent is back.
func TestElectionGivenUpLeadershipStopsQueryingItsKey(t *testing.T) {
	s, la, _, _ := electA(t)
	s.Stop()
	select {
	case <-la.Lost():
	case <-time.After(2 * sessionTTL):
		t.Fatal("a's Lost() open while the agent is away")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(sessionTTL) // retries in flight end
	gets, renews := s.Requests("GET /v1/kv"), s.Requests("PUT /v1/session/renew")
	time.Sleep(2 * sessionTTL)
	if n := s.Requests("GET /v1/kv") - gets; n > 0 {
		t.Errorf("%d key queries in %s after the leadership was given up; want none", n, 2*sessionTTL)
	}
	if n := s.Requests("PUT /v1/session/renew") - renews; n > 0 {
		t.Errorf("%d session renewals in %s after the leadership was given up; want none", n, 2*sessionTTL)
	}
}
