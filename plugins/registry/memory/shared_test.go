package memory

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// sharedLog records what a WatchShared gives fn, and checks that fn never
// runs from two goroutines at once.
type sharedLog struct {
	mu      sync.Mutex
	inFn    bool
	overlap bool
	events  []string // "key=value", "key=<nil>"
}

func (l *sharedLog) fn(key string, value []byte) {
	l.mu.Lock()
	if l.inFn {
		l.overlap = true
	}
	l.inFn = true
	v := "<nil>"
	if value != nil {
		v = string(value)
	}
	l.events = append(l.events, key+"="+v)
	l.mu.Unlock()
	time.Sleep(time.Millisecond) // widen the window an overlapping call would need
	l.mu.Lock()
	l.inFn = false
	l.mu.Unlock()
}

func (l *sharedLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// await waits up to 2s for event to be the latest event of key.
func (l *sharedLog) await(t *testing.T, key, event string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		last := ""
		for _, e := range l.snapshot() {
			if strings.HasPrefix(e, key+"=") {
				last = e
			}
		}
		if last == event {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch: latest event of %s is %q after 2s, want %q (all: %v)", key, last, event, l.snapshot())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func watchShared(t *testing.T, r *Registry, prefix string) *sharedLog {
	t.Helper()
	l := &sharedLog{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.WatchShared(ctx, prefix, l.fn); err != nil {
		t.Fatalf("WatchShared(%q): %v", prefix, err)
	}
	return l
}

func TestSharedSnapshotThenChangesAcrossRegistries(t *testing.T) {
	a, b := open(t, nil), open(t, nil)
	ctx := context.Background()
	for _, kv := range []struct{ k, v string }{{"breaker/x", "1"}, {"breaker/a", "2"}, {"other/z", "3"}} {
		if err := a.PutShared(ctx, kv.k, []byte(kv.v), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	l := watchShared(t, b, "breaker/")
	// The snapshot is given before WatchShared returns, in key order,
	// without the keys of another prefix.
	if got := strings.Join(l.snapshot(), " "); got != "breaker/a=2 breaker/x=1" {
		t.Fatalf("snapshot %q, want %q", got, "breaker/a=2 breaker/x=1")
	}
	if err := a.PutShared(ctx, "breaker/x", []byte("4"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l.await(t, "breaker/x", "breaker/x=4")
	if err := b.DeleteShared(ctx, "breaker/a"); err != nil {
		t.Fatal(err)
	}
	l.await(t, "breaker/a", "breaker/a=<nil>")
	if err := b.DeleteShared(ctx, "breaker/missing"); err != nil {
		t.Errorf("DeleteShared of a missing key: %v, want nil", err)
	}
	for _, e := range l.snapshot() {
		if strings.HasPrefix(e, "other/") {
			t.Errorf("watch of breaker/ was given %s", e)
		}
	}
}

func TestSharedValueIsCopied(t *testing.T) {
	r := open(t, nil)
	v := []byte("abc")
	if err := r.PutShared(context.Background(), "k", v, time.Minute); err != nil {
		t.Fatal(err)
	}
	v[0] = 'X'
	var got []byte
	if err := r.WatchShared(t.Context(), "k", func(_ string, value []byte) { got = value }); err != nil {
		t.Fatal(err)
	}
	if string(got) != "abc" {
		t.Errorf("value %q after the caller changed its slice, want %q: the store must keep its own copy", got, "abc")
	}
}

func TestSharedEntryExpiresAfterItsTTL(t *testing.T) {
	a, b := open(t, nil), open(t, nil)
	l := watchShared(t, b, "")
	start := time.Now()
	if err := a.PutShared(context.Background(), "k", []byte("v"), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	l.await(t, "k", "k=v")
	l.await(t, "k", "k=<nil>")
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("entry gone after %v, before its 100ms ttl", took)
	}
}

func TestSharedDefaultTTL(t *testing.T) {
	r := open(t, map[string]any{"default_ttl": "50ms"})
	l := watchShared(t, r, "")
	if err := r.PutShared(context.Background(), "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	l.await(t, "k", "k=<nil>") // default_ttl, not forever
}

func TestSharedEntriesGoWithTheRegistryThatPutThemLast(t *testing.T) {
	ns := map[string]any{"namespace": t.Name()}
	a, b, watcher := open(t, ns), open(t, ns), open(t, ns)
	ctx := context.Background()
	l := watchShared(t, watcher, "")
	for _, step := range []struct {
		r *Registry
		k string
	}{{a, "mine"}, {a, "moved"}, {b, "moved"}, {b, "theirs"}} {
		if err := step.r.PutShared(ctx, step.k, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	l.await(t, "theirs", "theirs=v")
	a.Close()
	l.await(t, "mine", "mine=<nil>")
	// "moved" was put last by b: a's Close leaves it.
	time.Sleep(20 * time.Millisecond)
	for _, e := range l.snapshot() {
		if e == "moved=<nil>" || e == "theirs=<nil>" {
			t.Errorf("closing a removed %s, which b put last", e)
		}
	}
	b.Close()
	l.await(t, "moved", "moved=<nil>")
	l.await(t, "theirs", "theirs=<nil>")
}

func TestSharedNamespacesAreApart(t *testing.T) {
	a := open(t, map[string]any{"namespace": t.Name() + "-a"})
	b := open(t, map[string]any{"namespace": t.Name() + "-b"})
	if err := a.PutShared(context.Background(), "k", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l := watchShared(t, b, "")
	if got := l.snapshot(); len(got) != 0 {
		t.Errorf("namespace b sees %v, put in namespace a", got)
	}
}

func TestSharedWatchCallsFnFromOneGoroutineAtATime(t *testing.T) {
	r := open(t, nil)
	l := watchShared(t, r, "")
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 20 {
				key := string(rune('a'+i)) + string(rune('a'+j))
				if err := r.PutShared(context.Background(), key, []byte("v"), time.Minute); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	l.await(t, "dt", "dt=v")
	if l.overlap {
		t.Error("fn ran from two goroutines at once")
	}
}

func TestSharedWatchEndsWithItsContextAndWithClose(t *testing.T) {
	r := open(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	l := &sharedLog{}
	if err := r.WatchShared(ctx, "", l.fn); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(2 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.sharedWatches)
		r.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch's goroutine still runs 2s after its ctx was cancelled")
		}
		time.Sleep(time.Millisecond)
	}
	if err := r.PutShared(context.Background(), "k", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if got := l.snapshot(); len(got) != 0 {
		t.Errorf("a cancelled watch was given %v", got)
	}
	// A watch left open ends with Close (goleak checks the goroutine).
	if err := r.WatchShared(context.Background(), "", func(string, []byte) {}); err != nil {
		t.Fatal(err)
	}
	r.Close()
}

func TestSharedErrors(t *testing.T) {
	r := open(t, nil)
	ctx := context.Background()
	dead, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"empty key", r.PutShared(ctx, "", []byte("v"), time.Second), "empty key"},
		{"negative ttl", r.PutShared(ctx, "k", []byte("v"), -time.Second), "negative ttl"},
		{"put, ctx done", r.PutShared(dead, "k", nil, time.Second), "context canceled"},
		{"delete, ctx done", r.DeleteShared(dead, "k"), "context canceled"},
		{"watch, ctx done", r.WatchShared(dead, "", func(string, []byte) {}), "context canceled"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, tc.err, tc.want)
		}
	}
	r.Close()
	for name, err := range map[string]error{
		"put":    r.PutShared(ctx, "k", nil, time.Second),
		"delete": r.DeleteShared(ctx, "k"),
		"watch":  r.WatchShared(ctx, "", func(string, []byte) {}),
	} {
		if !errors.Is(err, kernel.ErrClosed) {
			t.Errorf("%s after Close: %v, want kernel.ErrClosed", name, err)
		}
	}
}

// An empty value is an entry, not a removal: fn gets it non-nil.
func TestSharedEmptyValueIsNotARemoval(t *testing.T) {
	r := open(t, nil)
	l := watchShared(t, r, "")
	for _, v := range [][]byte{nil, {}} {
		if err := r.PutShared(context.Background(), "k", v, time.Minute); err != nil {
			t.Fatal(err)
		}
		l.await(t, "k", "k=")
	}
}
