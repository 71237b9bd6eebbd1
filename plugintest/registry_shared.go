package plugintest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// sharedStore runs the kernel.SharedStore checks when the registry
// implements it, and skips them, saying why, when it does not:
//
//   - SharedStore/Snapshot: an entry put through one registry is given to
//     fn by a WatchShared of a second registry built alike, before
//     WatchShared returns, and entries of another prefix are not.
//   - SharedStore/Changes: a watcher of a second registry sees a put, a
//     new value of the same key, and a delete as a nil value.
//   - SharedStore/Expires: an entry nobody puts again is given as nil
//     within its ttl (RegistryConfig.TTL) + Tolerance. Skipped when the
//     registry reports HonoursTTL false.
//   - SharedStore/CloseRemoves: the entries a registry put are given as
//     nil, to another registry's watcher, once it is closed.
//   - SharedStore/WatchEnds: once a watch's ctx is done, fn is not called
//     again and every goroutine the watch started ends within Tolerance.
func (s registryRun) sharedStore(t tb) {
	probe := s.open(t)
	if _, ok := probe.(kernel.SharedStore); !ok {
		t.Skipf("the registry does not implement kernel.SharedStore; plugins that share state through it (the breaker's share: registry) keep it local")
	}
	t.Run("Snapshot", s.sharedSnapshot)
	t.Run("Changes", s.sharedChanges)
	t.Run("Expires", s.sharedExpires)
	t.Run("CloseRemoves", s.sharedCloseRemoves)
	t.Run("WatchEnds", s.sharedWatchEnds)
}

// openShared opens a registry that the caller checked is a SharedStore.
func (s registryRun) openShared(t tb) kernel.SharedStore {
	t.Helper()
	return s.open(t).(kernel.SharedStore)
}

// sharedEvents records what fn is given, in order.
type sharedEvents struct {
	mu     sync.Mutex
	events []sharedEvent
	calls  int
}

type sharedEvent struct {
	key   string
	value []byte // nil: removed or expired
}

func (e *sharedEvents) fn(key string, value []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	e.events = append(e.events, sharedEvent{key, value})
}

func (e *sharedEvents) list() []sharedEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.events)
}

// latest is key's last value given to fn, and whether any was.
func (e *sharedEvents) latest(key string) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.events) - 1; i >= 0; i-- {
		if e.events[i].key == key {
			return e.events[i].value, true
		}
	}
	return nil, false
}

// await polls until key's latest value is want (nil: removed), failing t
// after d.
func (e *sharedEvents) await(t tb, key string, want []byte, d time.Duration, when string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got, seen := e.latest(key)
		if seen && (want == nil) == (got == nil) && string(got) == string(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WatchShared %s: key %q's latest value is %s after %s; want %s (fn was given: %s)",
				when, key, sharedFormat(got, seen), d, sharedFormat(want, true), e.format())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *sharedEvents) format() string {
	var b strings.Builder
	for i, ev := range e.list() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ev.key + "=" + sharedFormat(ev.value, true))
	}
	if b.Len() == 0 {
		return "nothing"
	}
	return b.String()
}

func sharedFormat(v []byte, seen bool) string {
	switch {
	case !seen:
		return "nothing"
	case v == nil:
		return "nil (removed)"
	}
	return fmt.Sprintf("%q", v)
}

// sharedPrefix is a key prefix of one subtest's own.
func sharedPrefix(t tb) string { return "plugintest/" + registryService(t) + "/" }

func (s registryRun) sharedPut(t tb, r kernel.SharedStore, key, value string, ttl time.Duration) {
	t.Helper()
	if err := r.PutShared(registryContext(t), key, []byte(value), ttl); err != nil {
		t.Fatalf("PutShared(%q, ttl %s): %v; want nil", key, ttl, err)
	}
}

func (s registryRun) sharedStoreWatch(t tb, ctx context.Context, r kernel.SharedStore, prefix string) *sharedEvents {
	t.Helper()
	e := &sharedEvents{}
	if err := r.WatchShared(ctx, prefix, e.fn); err != nil {
		t.Fatalf("WatchShared(%q): %v; want nil", prefix, err)
	}
	return e
}

func (s registryRun) sharedSnapshot(t tb) {
	writer, reader := s.openShared(t), s.openShared(t)
	prefix := sharedPrefix(t)
	s.sharedPut(t, writer, prefix+"a", "one", registryLongTTL)
	s.sharedPut(t, writer, prefix+"b/c", "two", registryLongTTL)
	s.sharedPut(t, writer, strings.TrimSuffix(prefix, "/")+"-other/a", "elsewhere", registryLongTTL)
	// A backend that shows a write to other clients late (etcd, consul)
	// is given Tolerance before the snapshot is taken.
	deadline := time.Now().Add(s.cfg.tolerance())
	for {
		e := s.sharedStoreWatch(t, registryContext(t), reader, prefix)
		got := map[string]string{}
		for _, ev := range e.list() { // taken as WatchShared returned: the snapshot
			got[ev.key] = string(ev.value)
		}
		want := map[string]string{prefix + "a": "one", prefix + "b/c": "two"}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WatchShared(%q) of a second registry gave %v before it returned; want exactly %v "+
				"(every entry under the prefix, put by another registry of the same backend, and no other)", prefix, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s registryRun) sharedChanges(t tb) {
	writer, reader := s.openShared(t), s.openShared(t)
	prefix := sharedPrefix(t)
	tolerance := s.cfg.tolerance()
	e := s.sharedStoreWatch(t, registryContext(t), reader, prefix)
	key := prefix + "k"
	s.sharedPut(t, writer, key, "v1", registryLongTTL)
	e.await(t, key, []byte("v1"), tolerance, "after another registry put it")
	s.sharedPut(t, writer, key, "v2", registryLongTTL)
	e.await(t, key, []byte("v2"), tolerance, "after another registry put it again with a new value")
	if err := writer.DeleteShared(registryContext(t), key); err != nil {
		t.Fatalf("DeleteShared(%q): %v; want nil", key, err)
	}
	e.await(t, key, nil, tolerance, "after another registry deleted it (a removal is given as a nil value)")
	if err := writer.DeleteShared(registryContext(t), prefix+"never-put"); err != nil {
		t.Errorf("DeleteShared of a key nobody put: %v; want nil", err)
	}
}

func (s registryRun) sharedExpires(t tb) {
	writer := s.openShared(t)
	if caps, ok := writer.(kernel.RegistryCapabilities); ok && !caps.HonoursTTL() {
		t.Skipf("the registry reports HonoursTTL() == false: its shared entries are not expected to expire")
	}
	reader := s.openShared(t)
	prefix := sharedPrefix(t)
	ttl, tolerance := s.cfg.ttl(), s.cfg.tolerance()
	e := s.sharedStoreWatch(t, registryContext(t), reader, prefix)
	key := prefix + "short"
	s.sharedPut(t, writer, key, "v", ttl)
	e.await(t, key, []byte("v"), tolerance, "after another registry put it")
	e.await(t, key, nil, ttl+tolerance, fmt.Sprintf("after an entry put with ttl %s was not put again (it must expire)", ttl))
}

func (s registryRun) sharedCloseRemoves(t tb) {
	closing, reader := s.openShared(t), s.openShared(t)
	prefix := sharedPrefix(t)
	tolerance := s.cfg.tolerance()
	e := s.sharedStoreWatch(t, registryContext(t), reader, prefix)
	key := prefix + "k"
	s.sharedPut(t, closing, key, "v", registryLongTTL)
	e.await(t, key, []byte("v"), tolerance, "after another registry put it")
	if err := closing.(kernel.Registry).Close(); err != nil {
		t.Fatalf("Close: %v; want nil", err)
	}
	e.await(t, key, nil, tolerance, "after the registry that put it (ttl 1m) was closed: Close must remove its entries")
}

func (s registryRun) sharedWatchEnds(t tb) {
	tolerance := s.cfg.tolerance()
	writer := s.openShared(t)
	prefix := sharedPrefix(t)
	reader := s.openShared(t)
	// A first call connects each registry (an etcd client dials on first
	// use), from a goroutine that has ended before the tree starts: the
	// connections' goroutines, which live until Close, are not traced to
	// the tree's root (ancestry is learnt from "created by" lines, so a
	// call from the root itself would have them counted).
	warm := make(chan error, 1)
	go func() {
		ctx := registryContext(t)
		warm <- errors.Join(reader.PutShared(ctx, prefix+"warm-up", []byte("v"), registryLongTTL),
			writer.PutShared(ctx, prefix+"warm-up", []byte("v"), registryLongTTL))
	}()
	if err := <-warm; err != nil {
		t.Fatalf("PutShared: %v; want nil", err)
	}
	tree := newGoroutineTree()
	ctx, cancel := context.WithCancel(registryContext(t))
	defer cancel()
	e := s.sharedStoreWatch(t, ctx, reader, prefix)
	tree.snapshot()
	s.sharedPut(t, writer, prefix+"before", "v", registryLongTTL)
	e.await(t, prefix+"before", []byte("v"), tolerance, "after another registry put it")
	tree.snapshot()
	cancel()
	if left := tree.await(tolerance); len(left) > 0 {
		t.Errorf("%d goroutines WatchShared started still run %s after its ctx was cancelled (the registry is still open): "+
			"a watch must end with its ctx:\n%s", len(left), tolerance, registryStacks(left))
	}
	e.mu.Lock()
	calls := e.calls
	e.mu.Unlock()
	s.sharedPut(t, writer, prefix+"after", "v", registryLongTTL)
	time.Sleep(min(tolerance, 200*time.Millisecond))
	e.mu.Lock()
	later := e.calls - calls
	e.mu.Unlock()
	if later > 0 {
		t.Errorf("fn was called %d times after the watch's ctx was cancelled and its goroutines ended; want none", later)
	}
}
