package consultest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func ttlService(id, ttl string) *api.AgentServiceRegistration {
	return &api.AgentServiceRegistration{ID: id, Name: "web", Port: 80, Address: "10.0.0.1",
		Check: &api.AgentServiceCheck{CheckID: "service:" + id, TTL: ttl, Status: api.HealthPassing, DeregisterCriticalServiceAfter: "200ms"}}
}

func TestBlockingHealthQuery(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	_, meta, err := c.Health().Service("web", "", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if meta.LastIndex == 0 {
		t.Fatalf("X-Consul-Index of an unknown service is 0; a blocking client must never be told 0")
	}

	t.Run("returns after wait when nothing changes", func(t *testing.T) {
		start := time.Now()
		_, m, err := c.Health().Service("web", "", true, &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Errorf("a blocking query with nothing to report returned after %s; want at least its wait of 200ms", took)
		}
		if m.LastIndex != meta.LastIndex {
			t.Errorf("index moved from %d to %d without a change", meta.LastIndex, m.LastIndex)
		}
	})
	t.Run("returns when the service changes", func(t *testing.T) {
		go func() {
			time.Sleep(100 * time.Millisecond)
			c.Agent().ServiceRegister(ttlService("web-1", "10s"))
		}()
		start := time.Now()
		entries, m, err := c.Health().Service("web", "", true, &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the query returned after %s, long after the registration at 100ms", took)
		}
		if m.LastIndex <= meta.LastIndex || len(entries) != 1 || entries[0].Service.ID != "web-1" {
			t.Errorf("after a registration: index %d (was %d), entries %v; want a higher index and web-1", m.LastIndex, meta.LastIndex, entries)
		}
	})
	t.Run("other services do not wake it", func(t *testing.T) {
		_, m, _ := c.Health().Service("web", "", true, nil)
		go func() {
			time.Sleep(50 * time.Millisecond)
			c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "db", Name: "db"})
		}()
		start := time.Now()
		_, m2, err := c.Health().Service("web", "", true, &api.QueryOptions{WaitIndex: m.LastIndex, WaitTime: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) < 300*time.Millisecond || m2.LastIndex != m.LastIndex {
			t.Errorf("a registration of another service woke a query on web (index %d -> %d)", m.LastIndex, m2.LastIndex)
		}
	})
}

func TestTTLCheckExpiresAndIsReaped(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	if err := c.Agent().ServiceRegister(ttlService("web-1", "200ms")); err != nil {
		t.Fatal(err)
	}
	passing := func() int { e, _, _ := c.Health().Service("web", "", true, nil); return len(e) }
	any := func() int { e, _, _ := c.Health().Service("web", "", false, nil); return len(e) }
	if passing() != 1 {
		t.Fatalf("a service registered with a passing check is not passing")
	}
	// Passing it keeps it alive past its TTL.
	for range 4 {
		time.Sleep(100 * time.Millisecond)
		if err := c.Agent().UpdateTTL("service:web-1", "ok", api.HealthPassing); err != nil {
			t.Fatal(err)
		}
	}
	if passing() != 1 {
		t.Fatalf("a check passed every 100ms with a TTL of 200ms went critical")
	}
	took := eventually(t, time.Second, "TTL check goes critical", func() bool { return passing() == 0 })
	if any() != 1 {
		t.Errorf("the service left the catalog when its check went critical; it must stay until reaped")
	}
	t.Logf("critical after %s", took)
	eventually(t, 2*time.Second, "critical service reaped after deregister_critical_service_after", func() bool { return any() == 0 })
	err := c.Agent().UpdateTTL("service:web-1", "", api.HealthPassing)
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("UpdateTTL of a reaped check: %v; want a 404", err)
	}
}

func TestServiceMetaIsValidatedAsConsulDoes(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	long := make([]byte, 513)
	for i := range long {
		long[i] = 'x'
	}
	for name, meta := range map[string]map[string]string{
		"slash in key":      {"a/b": "1"},
		"upper case is ok?": nil,
		"reserved prefix":   {"consul-x": "1"},
		"value over 512":    {"k": string(long)},
	} {
		err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "x", Name: "x", Meta: meta})
		if meta == nil {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		var se api.StatusError
		if !errors.As(err, &se) || se.Code != 400 {
			t.Errorf("%s: register = %v; want a 400 as Consul gives", name, err)
		}
	}
	okMeta := map[string]string{"Upper_Case-key": string(long[:512])}
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "y", Name: "y", Meta: okMeta}); err != nil {
		t.Errorf("meta at the limits refused: %v", err)
	}
}

func TestSessionsAndLocks(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	kv, sess := c.KV(), c.Session()
	if _, _, err := sess.CreateNoChecks(&api.SessionEntry{TTL: "50ms"}, nil); err == nil {
		t.Errorf("a session TTL under session_ttl_min was accepted")
	}
	a, _, err := sess.CreateNoChecks(&api.SessionEntry{TTL: "100ms", LockDelay: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := sess.CreateNoChecks(&api.SessionEntry{TTL: "10s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(id string) bool {
		ok, _, err := kv.Acquire(&api.KVPair{Key: "lock", Value: []byte(id), Session: id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !acquire(a) {
		t.Fatal("a free lock could not be acquired")
	}
	if acquire(b) {
		t.Fatal("a held lock was acquired by another session")
	}
	pair, meta, _ := kv.Get("lock", nil)
	if pair == nil || pair.Session != a || pair.LockIndex != 1 {
		t.Fatalf("lock = %+v; want held by a with LockIndex 1", pair)
	}
	// Renewing keeps a alive past its TTL; twice the TTL after the last
	// renewal, it is gone and the lock free.
	for range 3 {
		time.Sleep(80 * time.Millisecond)
		if e, _, err := sess.Renew(a, nil); err != nil || e == nil {
			t.Fatalf("renew: %v %v", e, err)
		}
	}
	start := time.Now()
	pair, _, err = kv.Get("lock", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Since(start)
	if pair == nil || pair.Session != "" {
		t.Fatalf("after a's TTL: lock = %+v; want released (behavior release)", pair)
	}
	if gone < 150*time.Millisecond {
		t.Errorf("a's session ended %s after its last renewal; Consul keeps it for twice its TTL (200ms)", gone)
	}
	if e, _, _ := sess.Renew(a, nil); e != nil {
		t.Errorf("an expired session was renewed")
	}
	if acquire(b) {
		t.Errorf("the lock was acquired within the lock-delay of the session that held it")
	}
	eventually(t, time.Second, "acquire after the lock-delay", func() bool { return acquire(b) })
	if ok, _, _ := kv.Release(&api.KVPair{Key: "lock", Session: a}, nil); ok {
		t.Errorf("a session that does not hold the lock released it")
	}
	if ok, _, _ := kv.Release(&api.KVPair{Key: "lock", Session: b}, nil); !ok {
		t.Errorf("the holder could not release the lock")
	}
	if _, err := sess.Destroy(b, nil); err != nil {
		t.Fatal(err)
	}
	if info, _, _ := sess.Info(b, nil); info != nil {
		t.Errorf("a destroyed session still has info %+v", info)
	}
}

func TestWipeAbandonsBlockingQueriesWithALowerIndex(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	for i := range 20 {
		c.Agent().ServiceRegister(ttlService("web-"+string(rune('a'+i)), "10s"))
	}
	_, meta, _ := c.Health().Service("web", "", true, nil)
	go func() {
		time.Sleep(100 * time.Millisecond)
		s.Wipe()
	}()
	start := time.Now()
	entries, m, err := c.Health().Service("web", "", true, &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second || len(entries) != 0 || m.LastIndex >= meta.LastIndex {
		t.Errorf("after Wipe: %d entries, index %d (was %d); want the query back at once, empty, with a lower index", len(entries), m.LastIndex, meta.LastIndex)
	}
}

func TestStopAndStart(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	s.Stop()
	if _, _, err := c.Health().Service("web", "", true, nil); err == nil {
		t.Fatal("a stopped stand-in answered")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Health().Service("web", "", true, nil); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}

// GET /v1/kv/:prefix?recurse lists the entries under a prefix, by key, and
// blocks on the prefix's last change, a deletion included; DELETE with
// ?cas= deletes only at the entry's ModifyIndex, and never with cas=0.
func TestKVPrefixListsAndCheckAndSetDeletes(t *testing.T) {
	s := standIn(t, fast)
	kv := apiClient(t, s.Addr()).KV()
	for _, k := range []string{"p/b", "p/a", "q/a"} {
		if _, err := kv.Put(&api.KVPair{Key: k, Value: []byte(k)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	pairs, meta, err := kv.List("p/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pairs) != 2 || pairs[0].Key != "p/a" || pairs[1].Key != "p/b" {
		t.Fatalf("List(p/) = %v; want p/a, p/b", pairs)
	}
	if empty, _, err := kv.List("none/", nil); err != nil || empty != nil {
		t.Errorf("List of an empty prefix: %v, %v; want nothing (404), no error", empty, err)
	}

	blocked := make(chan uint64, 1)
	go func() {
		_, m, err := kv.List("p/", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Second})
		if err != nil {
			t.Error(err)
		}
		blocked <- m.LastIndex
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := kv.Put(&api.KVPair{Key: "q/b", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case idx := <-blocked:
		t.Fatalf("a write outside the prefix ended the blocking list (index %d)", idx)
	case <-time.After(200 * time.Millisecond):
	}

	if ok, _, err := kv.DeleteCAS(&api.KVPair{Key: "p/a", ModifyIndex: 0}, nil); err != nil || ok {
		t.Errorf("DeleteCAS at index 0: %v, %v; want false, as Consul deletes nothing with cas=0", ok, err)
	}
	if ok, _, err := kv.DeleteCAS(&api.KVPair{Key: "p/a", ModifyIndex: pairs[0].ModifyIndex + 100}, nil); err != nil || ok {
		t.Errorf("DeleteCAS at a wrong index: %v, %v; want false", ok, err)
	}
	if ok, _, err := kv.DeleteCAS(pairs[0], nil); err != nil || !ok {
		t.Fatalf("DeleteCAS at the entry's index: %v, %v; want true", ok, err)
	}
	select {
	case idx := <-blocked:
		if idx <= meta.LastIndex {
			t.Errorf("after a deletion under the prefix the index is %d; want above %d", idx, meta.LastIndex)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("deleting p/a did not end the blocking list of p/")
	}
	if pairs, _, err := kv.List("p/", nil); err != nil || len(pairs) != 1 || pairs[0].Key != "p/b" {
		t.Errorf("List(p/) after the deletion = %v, %v; want p/b", pairs, err)
	}
}
