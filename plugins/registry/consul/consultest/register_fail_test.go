package consultest_test

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A Register of an instance already registered that fails (the agent away
// for a moment) leaves the instance as it was: in particular its check is
// still passed at the cadence of the ttl the agent has, not at that of the
// ttl the failed Register asked for, which would let the check go critical
// and the instance leave discovery.
func TestAFailedRegisterAgainKeepsTheInstanceAsItWas(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"timeout": "500ms", "deregister_critical_service_after": "1m"})
	in := instance("echo", "a")
	const ttl = 2 * time.Second
	if err := r.Register(ctx(t), in, ttl); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := r.Register(ctx(t), in, time.Minute); err == nil {
		t.Fatal("Register with the agent stopped succeeded")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	observer := open(t, s.Addr(), nil)
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		set, err := observer.Resolve(ctx(t), "echo")
		if err != nil {
			t.Fatal(err)
		}
		if len(set) != 1 {
			t.Fatalf("%s after a failed Register again, the instance registered with ttl %s resolves as %v; want it still there, its check passed",
				time.Since(end.Add(-2*ttl)).Round(time.Millisecond), ttl, set)
		}
	}
}

// A Deregister that fails (the agent away for a moment) leaves the
// instance as it was, as its caller is told: registered, its check passed,
// its loads reported, and removed by Close. The server, which takes a
// failed Deregister for one that did not happen, would otherwise keep
// serving an instance that leaves discovery within its ttl, and never
// register it again.
func TestAFailedDeregisterKeepsTheInstanceAsItWas(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"timeout": "500ms", "deregister_critical_service_after": "1m"})
	in := instance("echo", "a")
	const ttl = time.Second
	if err := r.Register(ctx(t), in, ttl); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := r.Deregister(ctx(t), in); err == nil {
		t.Fatal("Deregister with the agent stopped succeeded")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	observer := open(t, s.Addr(), nil)
	time.Sleep(2 * ttl)
	if set, err := observer.Resolve(ctx(t), "echo"); err != nil || ids(set) != "a" {
		t.Fatalf("%s after a failed Deregister, Resolve = %v, %v; want the instance still there, its check passed", 2*ttl, set, err)
	}
	if err := r.ReportLoad(ctx(t), in, kernel.Load{InFlight: 1, QPS: 1}); err != nil {
		t.Errorf("ReportLoad after a failed Deregister: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := s.Requests("PUT /v1/agent/service/deregister"); n != 1 {
		t.Errorf("%d deregistrations reached the agent; want Close's one", n)
	}
	if set, err := open(t, s.Addr(), nil).Resolve(ctx(t), "echo"); err != nil || len(set) != 0 {
		t.Errorf("after Close, Resolve = %v, %v; want no instance", set, err)
	}
}
