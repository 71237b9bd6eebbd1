package breaker

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// flakyStore is a registry that shares state, failing its first
// watchFails WatchShared calls and every write while writeErr is set.
type flakyStore struct {
	kernel.Registry
	watchFails int
	writeErr   error

	mu      sync.Mutex
	watches int
	fn      func(key string, value []byte)
	writes  int
}

func (s *flakyStore) WatchShared(ctx context.Context, prefix string, fn func(string, []byte)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watches++
	if s.watches <= s.watchFails {
		return errors.New("etcdserver: no leader")
	}
	s.fn = fn
	return nil
}

func (s *flakyStore) PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.writeErr
}

func (s *flakyStore) DeleteShared(ctx context.Context, key string) error {
	return s.PutShared(ctx, key, nil, 0)
}

// watcher is the fn the store was last given, nil before a watch took.
func (s *flakyStore) watcher() func(string, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fn
}

// sharingFilter is a client-side breaker with share: registry, logging
// into logs, that has not yet looked for the client's registry.
func sharingFilter(t *testing.T, logs *syncbuf.Buffer) *Filter {
	t.Helper()
	opts := map[string]any{"share": "registry", "share_namespace": "ns"}
	for k, v := range small {
		opts[k] = v
	}
	flt, err := Factory.Build(opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := flt.(*Filter)
	t.Cleanup(func() { f.Close() })
	f.log = slog.New(slog.NewTextHandler(logs, nil))
	return f
}

// observe shows f the client's plugins: itself, and a registry named name
// unless it is nil.
func observe(f *Filter, name string, registry kernel.Registry) {
	refs := []kernel.PluginRef{{Kind: kernel.KindFilter, Name: Name, Side: kernel.ClientSide, Plugin: f}}
	if registry != nil {
		refs = append(refs, kernel.PluginRef{Kind: kernel.KindRegistry, Name: name, Side: kernel.ClientSide, Plugin: registry})
	}
	f.ObservePlugins(refs)
}

// A store that cannot be watched when the client starts is watched once
// it can be: the filter says so at WARN, keeps retrying, and then follows
// the other clients' openings.
func TestShareFollowsAStoreThatFailsAtFirst(t *testing.T) {
	store := &flakyStore{watchFails: 1}
	var logs syncbuf.Buffer
	f := sharingFilter(t, &logs)
	observe(f, "flaky", store)
	for _, w := range []string{"level=WARN", "cannot follow the shared breaker state yet; retrying", "registry=flaky", "no leader"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log %q does not say %q", logs.String(), w)
		}
	}
	waitUntil(t, "the watch retried after a failed first try", func() bool { return store.watcher() != nil })
	// An opening of another client now reaches the filter.
	r := &rig{t: t, f: f}
	f.now = func() int64 { return int64(r.clock) }
	k := f.share.sharedKey(keyA)
	v := []byte(`{"open_until_unix_nano":` + strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10) + `,"failures":9,"calls":10,"origin":"other"}`)
	store.watcher()(k, v)
	if err := r.call(hostA, nil); err == nil || r.calls != 0 || !strings.Contains(err.Error(), "another client") {
		t.Errorf("call after another client's opening arrived through the retried watch: %v, %d calls made; want it refused", err, r.calls)
	}
	r.wantState(hostA, Open, "another client's opening")
}

// Publications the store refuses are counted and logged, naming the
// circuit, and fail no call.
func TestShareCountsRefusedPublications(t *testing.T) {
	store := &flakyStore{writeErr: errors.New("etcdserver: request timed out")}
	var logs syncbuf.Buffer
	f := sharingFilter(t, &logs)
	observe(f, "flaky", store)
	r := &rig{t: t, f: f}
	f.now = func() int64 { return int64(r.clock) }
	for range 4 {
		if err := r.call(hostA, errUnavailable); err != errUnavailable {
			t.Fatalf("call: %v; want next's error, the publication failing aside", err)
		}
	}
	r.wantState(hostA, Open, "4 failures")
	waitUntil(t, "a refused publication counted", func() bool { return f.share.failed.Load() > 0 })
	want(t, readings(t, f), "breaker_share_failed_total{}", 1)
	for _, w := range []string{"level=WARN", "could not publish a breaker's state", "Echo.Who on " + hostA, "request timed out"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log %q does not say %q", logs.String(), w)
		}
	}
}

// share: registry on a client with no registry is an error in the log,
// and the state stays local.
func TestShareWithoutARegistryIsLogged(t *testing.T) {
	var logs syncbuf.Buffer
	f := sharingFilter(t, &logs)
	observe(f, "", nil)
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "the client has no registry") {
		t.Errorf("log %q; want an ERROR saying the client has no registry", logs.String())
	}
	if f.share.active.Load() {
		t.Error("sharing is active without a registry")
	}
}

// waitUntil polls cond until it holds, failing t after 5s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
