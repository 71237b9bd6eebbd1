package consultest_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/plugins/registry/consul/consultest"
)

// fast is the stand-in's timing in these tests: a reaper every 100ms with
// no floor on deregister_critical_service_after, and sessions from 100ms.
var fast = consultest.Options{ReapInterval: 100 * time.Millisecond, MinDeregisterAfter: time.Millisecond, MinSessionTTL: 100 * time.Millisecond}

// standIn starts a stand-in agent that t stops.
func standIn(t testing.TB, opts consultest.Options) *consultest.Server {
	t.Helper()
	s, err := consultest.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// apiClient is a plain Consul client of addr, for looking behind the
// plugin; its idle connections are closed when t ends.
func apiClient(t testing.TB, addr string) *api.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := api.NewClient(&api.Config{Address: addr, HttpClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// eventually polls cond every 10ms until it holds or within passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}
