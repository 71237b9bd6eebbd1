package etcdtest

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// sharedPrefix is a shared_prefix of t's own, beside testPrefix.
func sharedPrefix(t testing.TB) string { return strings.TrimSuffix(testPrefix(t), "/") + "-shared/" }

// sharedLog records a WatchShared's entries.
type sharedLog struct {
	mu     sync.Mutex
	latest map[string][]byte
	seen   map[string]bool
}

func newSharedLog() *sharedLog {
	return &sharedLog{latest: map[string][]byte{}, seen: map[string]bool{}}
}

func (l *sharedLog) fn(key string, value []byte) {
	l.mu.Lock()
	l.latest[key], l.seen[key] = value, true
	l.mu.Unlock()
}

// await waits up to d for key's latest value to be want (nil: removed).
func (l *sharedLog) await(t *testing.T, key string, want []byte, d time.Duration, when string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		l.mu.Lock()
		got, seen := l.latest[key], l.seen[key]
		l.mu.Unlock()
		if seen && (got == nil) == (want == nil) && string(got) == string(want) {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: key %q is %q (seen %v) after %s; want %q (nil: removed)", when, key, got, seen, d, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openShared(t *testing.T, endpoint string) *etcd.Registry {
	return open(t, endpoint, map[string]any{"shared_prefix": sharedPrefix(t), "ttl": "1s"})
}

func TestSharedEntryGoesWhenItsRegistryCloses(t *testing.T) {
	srv := Start(t)
	writer, reader := openShared(t, srv.Endpoint()), openShared(t, srv.Endpoint())
	l := newSharedLog()
	if err := reader.WatchShared(ctxFor(t), "breaker/", l.fn); err != nil {
		t.Fatal(err)
	}
	if err := writer.PutShared(ctxFor(t), "breaker/a", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l.await(t, "breaker/a", []byte("v"), 5*time.Second, "after the put")
	// The entry is where the docs say, on a lease.
	k := keys(t, rawClient(t, srv.Endpoint()), sharedPrefix(t))
	if id, ok := k[sharedPrefix(t)+"breaker/a"]; !ok || id == 0 {
		t.Fatalf("keys under %s: %v; want %sbreaker/a on a lease", sharedPrefix(t), k, sharedPrefix(t))
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	// Its lease is a minute: only the revocation at Close removes it now.
	l.await(t, "breaker/a", nil, 2*time.Second, "after the registry that put it (ttl 1m) was closed")
}

func TestSharedEntryExpiresAndLeasesAreReused(t *testing.T) {
	srv := Start(t)
	writer, reader := openShared(t, srv.Endpoint()), openShared(t, srv.Endpoint())
	l := newSharedLog()
	if err := reader.WatchShared(ctxFor(t), "", l.fn); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, k := range []string{"a", "b", "c"} {
		if err := writer.PutShared(ctxFor(t), k, []byte(k), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := writer.Stats(); got.SharedWrites != 3 || got.SharedLeaseGrants != 1 {
		t.Errorf("3 puts of one ttl within a second: %d writes, %d lease grants; want 3 and 1", got.SharedWrites, got.SharedLeaseGrants)
	}
	l.await(t, "c", []byte("c"), 5*time.Second, "after the put")
	// A 1s entry, on a 2s lease, and etcd's lessor checks every 500ms.
	l.await(t, "a", nil, 4*time.Second, "an entry put with ttl 1s and never put again")
	if took := time.Since(start); took < time.Second {
		t.Errorf("a 1s entry went after %v", took)
	}
}

// A shared lease etcd lost before its time (revoked behind the
// registry's back) costs the next put nothing but a fresh grant; a put
// with an empty key or a negative ttl is refused before etcd is asked.
func TestSharedPutOutlivesALostLease(t *testing.T) {
	srv := Start(t)
	writer, reader := openShared(t, srv.Endpoint()), openShared(t, srv.Endpoint())
	l := newSharedLog()
	if err := reader.WatchShared(ctxFor(t), "", l.fn); err != nil {
		t.Fatal(err)
	}
	if err := writer.PutShared(ctxFor(t), "a", []byte("1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l.await(t, "a", []byte("1"), 5*time.Second, "after the first put")
	raw := rawClient(t, srv.Endpoint())
	id := keys(t, raw, sharedPrefix(t))[sharedPrefix(t)+"a"]
	if _, err := raw.Revoke(ctxFor(t), id); err != nil {
		t.Fatal(err)
	}
	l.await(t, "a", nil, 5*time.Second, "after its lease was revoked")
	if err := writer.PutShared(ctxFor(t), "a", []byte("2"), time.Minute); err != nil {
		t.Fatalf("a put whose lease etcd lost: %v", err)
	}
	l.await(t, "a", []byte("2"), 5*time.Second, "after the put that followed the lost lease")
	if got := writer.Stats(); got.SharedWrites != 2 || got.SharedLeaseGrants != 2 {
		t.Errorf("two puts around a lost lease: %d writes, %d lease grants; want 2 and 2", got.SharedWrites, got.SharedLeaseGrants)
	}
	if newID := keys(t, raw, sharedPrefix(t))[sharedPrefix(t)+"a"]; newID == 0 || newID == id {
		t.Errorf("the entry's lease after the loss: %x (was %x); want a new one", newID, id)
	}
	for _, tc := range []struct {
		key  string
		ttl  time.Duration
		want string
	}{
		{"", time.Minute, "put shared: empty key"},
		{"b", -time.Second, "put shared b: negative ttl -1s"},
	} {
		if err := writer.PutShared(ctxFor(t), tc.key, []byte("x"), tc.ttl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PutShared(%q, ttl %s): %v; want %q", tc.key, tc.ttl, err, tc.want)
		}
	}
}

// A shared watch cut off from etcd while entries change and etcd
// compacts its history past the watch's revision reads the prefix again
// on reconnecting: fn gets every entry again, and nil for the one deleted
// while it was away; then it follows on.
func TestSharedWatchRereadsAfterCompaction(t *testing.T) {
	srv := Start(t)
	proxy := startProxy(t, srv.Endpoint())
	reader := open(t, proxy.Addr(), map[string]any{"shared_prefix": sharedPrefix(t)})
	writer := openShared(t, srv.Endpoint())
	cli := rawClient(t, srv.Endpoint())
	ctx := ctxFor(t)
	l := newSharedLog()
	for _, k := range []string{"gone", "kept"} {
		if err := writer.PutShared(ctx, k, []byte("1"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := reader.WatchShared(ctx, "", l.fn); err != nil {
		t.Fatal(err)
	}
	l.await(t, "gone", []byte("1"), time.Second, "in the snapshot")
	proxy.Cut()
	if err := writer.DeleteShared(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := writer.PutShared(ctx, "kept", []byte("2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "no-such-key")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatalf("compact at %d: %v", resp.Header.Revision, err)
	}
	proxy.Restore()
	l.await(t, "kept", []byte("2"), 5*time.Second, "after the partition healed, past a compaction")
	l.await(t, "gone", nil, time.Second, "deleted while the watch was cut off and compacted away")
	if err := writer.PutShared(ctx, "new", []byte("3"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l.await(t, "new", []byte("3"), 5*time.Second, "a put after the re-read")
}

// A shared watch cut off while more than a thousand revisions change its
// prefix gets every change on resuming, though etcd sends them in batches
// of 1000 revisions, each under the revision etcd is at (see
// TestResumeBeyondOneBatchMissesNothing).
func TestSharedWatchResumeBeyondOneBatchMissesNothing(t *testing.T) {
	srv := Start(t)
	proxy := startProxy(t, srv.Endpoint())
	reader := open(t, proxy.Addr(), map[string]any{"shared_prefix": sharedPrefix(t)})
	cli := rawClient(t, srv.Endpoint())
	ctx := ctxFor(t)
	l := newSharedLog()
	if err := reader.WatchShared(ctx, "", l.fn); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	const n = 1100
	putMany(t, cli, sharedPrefix(t), n, "1")
	proxy.Restore()
	seen := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.seen)
	}
	deadline := time.Now().Add(20 * time.Second)
	for seen() < 1000 {
		if time.Now().After(deadline) {
			t.Fatalf("the first batch's 1000 entries were not given after the partition healed (%d were)", seen())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := cli.Put(ctx, sharedPrefix(t)+"last", "2"); err != nil {
		t.Fatal(err)
	}
	l.await(t, "last", []byte("2"), 20*time.Second, "a put after the first batch")
	if got := seen(); got != n+1 {
		t.Errorf("%d entries given after the partition healed and %q was put; want all %d put meanwhile, and %q", got, "last", n, "last")
	}
}

// backend is one server of "echo" registered in etcd, failing every call
// when bad.
type backend struct {
	srv   *kernrpc.Server
	calls atomic.Int64
}

func engineConfig(t *testing.T, endpoint string) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry = kernrpc.PluginConfig{Name: etcd.Name, Options: map[string]any{
		"endpoints": []any{endpoint}, "prefix": testPrefix(t), "shared_prefix": sharedPrefix(t), "dial_timeout": "2s",
	}}
	cfg.Client.Timeout = kernel.Duration(5 * time.Second)
	return cfg
}

func serve(t *testing.T, cfg *kernrpc.Config, bad bool) *backend {
	t.Helper()
	b := &backend{}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
		b.calls.Add(1)
		if bad {
			return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
		}
		return &echopb.Echo{Text: "ok"}, nil
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	b.srv = srv
	return b
}

func dial(t *testing.T, cfg *kernrpc.Config, options map[string]any) (*kernrpc.Client, *breaker.Filter) {
	t.Helper()
	c := *cfg
	c.Filters = []kernrpc.FilterConfig{{Name: breaker.Name, Side: "client", Options: options}}
	cli, err := kernrpc.NewClient(&c, c.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	f, ok := kernrpc.FindPlugin[*breaker.Filter](cli.Plugins(), breaker.Name)
	if !ok {
		t.Fatal("no breaker among the client's plugins")
	}
	return cli, f
}

// Two clients of one etcd: once A's breaker opens for the failing
// instance, B refuses it from its first call; a client with share: none
// does not.
func TestBreakerOpeningSharedThroughEtcd(t *testing.T) {
	srv := Start(t)
	cfg := engineConfig(t, srv.Endpoint())
	bad := serve(t, cfg, true)
	serve(t, cfg, false)
	serve(t, cfg, false)
	opts := map[string]any{"share": "registry", "min_requests": 3, "open_duration": "30s"}
	a, fa := dial(t, cfg, opts)
	b, fb := dial(t, cfg, opts)
	local, _ := dial(t, cfg, map[string]any{"min_requests": 3, "open_duration": "30s"})

	addr := bad.srv.Addr()
	for i := 0; fa.State("Echo.Who", addr) != breaker.Open; i++ {
		if i == 100 {
			t.Fatalf("A's breaker for %s did not open in 100 calls", addr)
		}
		_ = a.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	deadline := time.Now().Add(5 * time.Second)
	for fb.State("Echo.Who", addr) != breaker.Open {
		if time.Now().After(deadline) {
			t.Fatalf("B's breaker for %s is %s 5s after A's opened; want open", addr, fb.State("Echo.Who", addr))
		}
		time.Sleep(5 * time.Millisecond)
	}
	sent := bad.calls.Load()
	for i := range 12 {
		if err := b.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
			t.Fatalf("B's call %d: %v; want a good instance's answer", i, err)
		}
	}
	if n := bad.calls.Load() - sent; n != 0 {
		t.Errorf("B sent %d calls to the instance A's breaker opened for; want none", n)
	}
	for range 12 {
		_ = local.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	if bad.calls.Load() == sent {
		t.Error("the client with share: none sent nothing to the bad instance: sharing cannot be told from chance")
	}
	// The opening is in etcd under the breaker's key.
	k := keys(t, rawClient(t, srv.Endpoint()), sharedPrefix(t)+"breaker/default/")
	if _, ok := k[sharedPrefix(t)+"breaker/default/Echo.Who|"+addr]; !ok {
		t.Errorf("shared keys %v; want breaker/default/Echo.Who|%s", k, addr)
	}
}
