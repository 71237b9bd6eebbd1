package consultest_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
	"github.com/kernrpc/kernrpc/plugins/registry/consul/consultest"
)

// open builds a registry from options(addr) with overrides; t closes it.
func open(t *testing.T, addr string, overrides map[string]any) *consul.Registry {
	t.Helper()
	o := options(addr)
	for k, v := range overrides {
		o[k] = v
	}
	r, err := consul.Factory.Build(o, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r.(*consul.Registry)
}

func instance(service, id string) kernel.Instance {
	return kernel.Instance{Service: service, ID: id, Address: "127.0.0.1:" + map[string]string{"a": "7001", "b": "7002", "c": "7003"}[id]}
}

func ids(set []kernel.Instance) string {
	var out []string
	for _, in := range set {
		out = append(out, in.ID)
	}
	return strings.Join(out, ",")
}

func resolveIs(t *testing.T, r kernel.Registry, service, want string) func() bool {
	return func() bool {
		set, err := r.Resolve(ctx(t), service)
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		return ids(set) == want
	}
}

// A watcher hears of a change as soon as the stand-in makes it, not at the
// end of the blocking query's wait: the cache follows with blocking
// queries, not by polling.
func TestWatchFollowsThroughBlockingQueries(t *testing.T) {
	s := standIn(t, fast)
	watching := open(t, s.Addr(), map[string]any{"wait_time": "1m"})
	writer := open(t, s.Addr(), nil)
	ch, err := watching.Watch(ctx(t), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if set := <-ch; len(set) != 0 {
		t.Fatalf("first set = %v; want empty", set)
	}
	time.Sleep(100 * time.Millisecond) // the loop's first blocking query is on its way
	queries := s.Requests("GET /v1/health/service")
	time.Sleep(500 * time.Millisecond)
	if n := s.Requests("GET /v1/health/service") - queries; n > 0 {
		t.Errorf("%d health queries in 500ms with nothing changing and a wait_time of 1m; the watch polls instead of blocking", n)
	}
	start := time.Now()
	if err := writer.Register(ctx(t), instance("echo", "a"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case set := <-ch:
		if ids(set) != "a" {
			t.Errorf("set after Register = %s; want a", ids(set))
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the watcher heard of the registration after %s", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not hear of the registration within 10s (its blocking query waits 1m)")
	}
}

// An instance whose process stops passing its check leaves discovery
// within its ttl (its check turns critical, and only passing instances
// are resolved) and is removed from the catalog by the agent's reaper
// after deregister_critical_service_after.
func TestAbandonedInstanceVanishesWithinTTLThenIsReaped(t *testing.T) {
	s := standIn(t, fast)
	dying := open(t, s.Addr(), map[string]any{"deregister_critical_service_after": "1s"})
	observer := open(t, s.Addr(), nil)
	const ttl = 400 * time.Millisecond
	if err := dying.Register(ctx(t), instance("echo", "a"), ttl); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "registered", resolveIs(t, observer, "echo", "a"))
	time.Sleep(2 * ttl) // kept alive meanwhile
	if !resolveIs(t, observer, "echo", "a")() {
		t.Fatalf("the instance left while its registry passed its check")
	}
	dying.AbandonLeases()
	took := eventually(t, ttl+500*time.Millisecond, "gone after AbandonLeases", resolveIs(t, observer, "echo", ""))
	t.Logf("gone from discovery %s after AbandonLeases (ttl %s)", took, ttl)
	c := apiClient(t, s.Addr())
	eventually(t, 3*time.Second, "reaped from the catalog", func() bool {
		e, _, err := c.Health().Service("echo", "", false, nil)
		return err == nil && len(e) == 0
	})
}

// Steady state costs one registration write per instance and then only
// check passes; when the agent loses the instance (a restart without its
// data), the registry registers it again, once.
func TestRegistrationWritesAndRecovery(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), nil)
	observer := open(t, s.Addr(), nil)
	if err := r.Register(ctx(t), instance("echo", "a"), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := s.Requests("PUT /v1/agent/service/register"); n != 1 {
		t.Errorf("%d registration writes in a second of steady state; want 1", n)
	}
	if n := s.Requests("PUT /v1/agent/check/update"); n < 2 {
		t.Errorf("%d check passes in a second with a ttl of 300ms; want one every 100ms", n)
	}
	s.Wipe()
	eventually(t, time.Second, "registered again after the agent lost it", resolveIs(t, observer, "echo", "a"))
	time.Sleep(500 * time.Millisecond)
	if n := s.Requests("PUT /v1/agent/service/register"); n != 2 {
		t.Errorf("%d registration writes after one loss; want 2 (one more, once)", n)
	}
}

// Load reports are written at most once per load_report_interval; the
// latest report of an interval is the one written.
func TestLoadReportsAreCoalesced(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"load_report_interval": "300ms"})
	in := instance("echo", "a")
	if err := r.Register(ctx(t), in, 0); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 50; i++ {
		if err := r.ReportLoad(ctx(t), in, kernel.Load{InFlight: int64(i), QPS: float64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Second, "the last load resolves", func() bool {
		set, _ := r.Resolve(ctx(t), "echo")
		return len(set) == 1 && set[0].Load.InFlight == 50 && set[0].Load.QPS == 50 && !set[0].Load.Updated.IsZero()
	})
	time.Sleep(400 * time.Millisecond)
	if n := s.Requests("PUT /v1/agent/service/register"); n != 3 {
		t.Errorf("%d registration writes for a Register and 50 load reports within one interval; want 3 (register, first report, the coalesced rest)", n)
	}
	if err := r.ReportLoad(ctx(t), instance("echo", "b"), kernel.Load{}); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("ReportLoad of an instance it did not register: %v; want an error saying so", err)
	}
}

// The cache serves Resolve while the agent is away, and catches up when it
// is back.
func TestResolveServesTheCacheWhileTheAgentIsDown(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"wait_time": "500ms"})
	writer := open(t, s.Addr(), nil)
	if err := writer.Register(ctx(t), instance("echo", "a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "registered", resolveIs(t, r, "echo", "a"))
	s.Stop()
	start := time.Now()
	set, err := r.Resolve(ctx(t), "echo")
	if err != nil || ids(set) != "a" {
		t.Errorf("Resolve with the agent down: %s, %v; want the cached set", ids(set), err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("a cached Resolve took %s with the agent down; it must not wait on Consul", took)
	}
	time.Sleep(time.Second) // the blocking query fails and backs off
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := writer.Register(ctx(t), instance("echo", "b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "caught up after the agent came back", resolveIs(t, r, "echo", "a,b"))
}

// When the index goes backwards (the agent lost its state), the cache
// starts over from index 0 instead of blocking on an index that will not
// come back.
func TestIndexGoingBackwardsResetsTheQuery(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"wait_time": "1m"})
	writer := open(t, s.Addr(), nil)
	// Push the index well above where a wiped agent starts.
	for range 30 {
		if err := writer.Register(ctx(t), instance("other", "a"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := r.Watch(ctx(t), "echo")
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	for range 30 {
		writer.Register(ctx(t), instance("echo", "a"), time.Minute)
	}
	<-ch
	// Let the watch's next blocking query reach the agent, so that Wipe
	// abandons it: it comes back with an index lower than the one it
	// waited on. (A query that arrives after the loss with the old index
	// waits until wait_time, as it would on Consul, and then comes back
	// with the lower index.)
	time.Sleep(200 * time.Millisecond)
	s.Wipe()
	if err := writer.Register(ctx(t), instance("echo", "b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case set := <-ch:
			if strings.Contains(ids(set), "b") {
				return
			}
		case <-deadline:
			t.Fatal("after the index went backwards the watcher missed a registration for 5s (wait_time 1m)")
		}
	}
}

// A dead agent is a clear error naming its address within the timeout
// option, whether nothing listens there or something accepts and never
// answers.
func TestUnreachableAgent(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var held []net.Conn
	var mu sync.Mutex
	conns.Go(func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	defer func() {
		silent.Close()
		conns.Wait()
		for _, c := range held {
			c.Close()
		}
	}()
	for name, addr := range map[string]string{"nothing listening": refused, "never answers": silent.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			r := open(t, addr, map[string]any{"timeout": "300ms"})
			calls := map[string]func() error{
				"Register":     func() error { return r.Register(ctx(t), instance("echo", "a"), 0) },
				"Resolve":      func() error { _, err := r.Resolve(ctx(t), "echo"); return err },
				"Watch":        func() error { _, err := r.Watch(ctx(t), "echo2"); return err },
				"Campaign":     func() error { _, err := r.Campaign(ctx(t), "e", "a"); return err },
				"PutShared":    func() error { return r.PutShared(ctx(t), "k", []byte("v"), 0) },
				"DeleteShared": func() error { return r.DeleteShared(ctx(t), "k") },
				"WatchShared":  func() error { return r.WatchShared(ctx(t), "k/", func(string, []byte) {}) },
			}
			for call, f := range calls {
				start := time.Now()
				err := f()
				took := time.Since(start)
				if err == nil || !strings.Contains(err.Error(), addr) {
					t.Errorf("%s against %s: %v; want an error naming the agent's address", call, name, err)
				}
				if took > 2*time.Second {
					t.Errorf("%s took %s to fail with a timeout of 300ms", call, took)
				}
			}
			r.Close()
		})
	}
}

func TestBadOptions(t *testing.T) {
	t.Setenv("CONSUL_HTTP_ADDR", "")
	for _, tc := range []struct {
		name string
		opts map[string]any
		key  string
	}{
		{"zero ttl", map[string]any{"ttl": "0s"}, "ttl"},
		{"negative wait", map[string]any{"wait_time": "-1s"}, "wait_time"},
		{"wait over Consul's cap", map[string]any{"wait_time": "11m"}, "wait_time"},
		{"zero timeout", map[string]any{"timeout": "0s"}, "timeout"},
		{"zero session ttl", map[string]any{"session_ttl": "0s"}, "session_ttl"},
		{"zero load interval", map[string]any{"load_report_interval": "0s"}, "load_report_interval"},
		{"deregister before the ttl", map[string]any{"ttl": "2m", "deregister_critical_service_after": "1m"}, "deregister_critical_service_after"},
		{"unknown scheme", map[string]any{"scheme": "ftp"}, "scheme"},
		{"scheme against the address", map[string]any{"address": "https://127.0.0.1:8501", "scheme": "http"}, "scheme"},
		{"address without port", map[string]any{"address": "localhost"}, "address"},
		{"address with a path", map[string]any{"address": "http://127.0.0.1:8500/consul"}, "address"},
		{"address of an unknown scheme", map[string]any{"address": "tcp://127.0.0.1:8500"}, "address"},
		{"tls over http", map[string]any{"tls": map[string]any{"ca_file": "/ca.pem"}}, "tls"},
		{"certificate without key", map[string]any{"scheme": "https", "tls": map[string]any{"cert_file": "/c.pem"}}, "tls"},
		{"missing CA file", map[string]any{"scheme": "https", "tls": map[string]any{"ca_file": "/nonexistent/ca.pem"}}, "tls"},
		{"typo", map[string]any{"tll": "1s"}, "tll"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := consul.Factory.Build(tc.opts, "test.yaml")
			if err == nil || !strings.Contains(err.Error(), `option "`+tc.key+`"`) {
				t.Errorf("Build(%v) = %v; want an error naming option %q", tc.opts, err, tc.key)
			}
		})
	}
	t.Run("address from CONSUL_HTTP_ADDR", func(t *testing.T) {
		s := standIn(t, fast)
		t.Setenv("CONSUL_HTTP_ADDR", s.Addr())
		r, err := consul.Factory.Build(map[string]any{}, "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Register(ctx(t), instance("echo", "a"), 0); err != nil {
			t.Errorf("Register through the agent CONSUL_HTTP_ADDR names: %v", err)
		}
	})
}

func TestRefusals(t *testing.T) {
	s := standIn(t, consultest.Options{})
	r := open(t, s.Addr(), nil)
	bad := []struct {
		name string
		in   kernel.Instance
	}{
		{"service with a slash", kernel.Instance{Service: "a/b", ID: "x", Address: "127.0.0.1:1"}},
		{"metadata too large", kernel.Instance{Service: "s", ID: "x", Address: "127.0.0.1:1", Metadata: map[string]string{"k": strings.Repeat("x", consul.MaxEncodedInstance)}}},
		{"metadata not UTF-8", kernel.Instance{Service: "s", ID: "x", Address: "127.0.0.1:1", Metadata: map[string]string{"k": "\xff"}}},
	}
	for _, tc := range bad {
		if err := r.Register(ctx(t), tc.in, 0); err == nil {
			t.Errorf("Register with %s: nil error", tc.name)
		}
	}
	if s.Requests("PUT /v1/agent/service/register") != 0 {
		t.Errorf("a refused instance reached the agent")
	}
	// The stand-in's default session_ttl_min (10s, as Consul's) refuses the
	// tests' 1s session_ttl, and the error says which option to change.
	_, err := r.Campaign(ctx(t), "e", "a")
	if err == nil || !strings.Contains(err.Error(), `option "session_ttl"`) {
		t.Errorf("Campaign with a session TTL under the agent's minimum: %v; want an error naming session_ttl", err)
	}
	r.Close()
	if err := r.Register(ctx(t), instance("echo", "a"), 0); !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("Register after Close: %v; want ErrClosed", err)
	}
	if _, err := r.Campaign(ctx(t), "e", "a"); !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("Campaign after Close: %v; want ErrClosed", err)
	}
}

// A Resolve or Watch waiting for a service's first answer when the
// registry is closed returns at once with kernel.ErrClosed: Close ends
// the query it waits on, so it has nothing more to wait for, however long
// the timeout option is.
func TestCloseEndsAWaitForTheFirstAnswer(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	var conns sync.WaitGroup
	conns.Go(func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	})
	defer func() {
		silent.Close()
		conns.Wait()
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	}()
	for _, call := range []string{"Resolve", "Watch"} {
		t.Run(call, func(t *testing.T) {
			r := open(t, silent.Addr().String(), map[string]any{"timeout": "1m"})
			done := make(chan error, 1)
			go func() {
				var err error
				if call == "Resolve" {
					_, err = r.Resolve(ctx(t), "echo")
				} else {
					_, err = r.Watch(ctx(t), "echo")
				}
				done <- err
			}()
			c := <-accepted // the first query is on its way
			defer c.Close()
			if err := r.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, kernel.ErrClosed) {
					t.Errorf("%s waiting when the registry closed: %v; want kernel.ErrClosed", call, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s still waits 20s after Close, for the first answer of a query Close ended", call)
			}
		})
	}
}

// Consul finds a service whatever the case of its name, but kernrpc's
// service names are exact: "Echo" and "echo" are two services, and a
// client of one must not be given the servers of the other (which would
// answer its calls with an unknown service).
func TestServicesDifferingOnlyInCaseStayApart(t *testing.T) {
	s := standIn(t, fast)
	upper := open(t, s.Addr(), nil)
	lower := open(t, s.Addr(), nil)
	observer := open(t, s.Addr(), nil)
	if err := upper.Register(ctx(t), instance("Echo", "a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := lower.Register(ctx(t), instance("echo", "b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	ch, err := observer.Watch(ctx(t), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if set := <-ch; ids(set) != "b" {
		t.Errorf("Watch(echo) first set: %s; want b only (a is of service Echo)", ids(set))
	}
	for _, tc := range []struct{ service, want string }{{"echo", "b"}, {"Echo", "a"}, {"ECHO", ""}} {
		set, err := observer.Resolve(ctx(t), tc.service)
		if err != nil {
			t.Fatal(err)
		}
		if ids(set) != tc.want {
			t.Errorf("Resolve(%s): %q; want %q", tc.service, ids(set), tc.want)
		}
		for _, in := range set {
			if in.Service != tc.service {
				t.Errorf("Resolve(%s) gave an instance of service %q", tc.service, in.Service)
			}
		}
	}
}
