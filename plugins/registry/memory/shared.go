package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

var _ kernel.SharedStore = (*Registry)(nil)

// sharedEntry is one key of the namespace's shared store (kernel.SharedStore).
type sharedEntry struct {
	value   []byte    // the store's own copy, never changed in place
	owner   *Registry // the registry that put it last: its Close removes it
	expires time.Time
}

// sharedWatch is one WatchShared. The store queues its changes under
// store.mu, coalesced by key (a watcher behind on a key gets only its
// latest value), and the watch's goroutine hands them to fn in order, so
// that fn never runs under the store's lock nor from two goroutines.
type sharedWatch struct {
	prefix  string
	fn      func(key string, value []byte)
	wake    chan struct{} // capacity 1: something is queued
	cancel  context.CancelFunc
	done    chan struct{}     // closed when the goroutine has ended
	order   []string          // queued keys, first queued first; guarded by store.mu
	pending map[string][]byte // key -> latest value, nil when removed; guarded by store.mu
}

// PutShared sets key to value in the namespace, for ttl (the default_ttl
// option when 0). Putting a key another registry put moves it to this one:
// the entry goes when the registry that put it last is closed.
func (r *Registry) PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: put shared %q: %w", key, err)
	}
	switch {
	case key == "":
		return errors.New("memory: put shared: empty key")
	case ttl < 0:
		return fmt.Errorf("memory: put shared %q: negative ttl %s", key, ttl)
	case ttl == 0:
		ttl = r.defaultTTL
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("memory: put shared %q: %w", key, kernel.ErrClosed)
	}
	// Never nil, even when empty: a nil value tells watchers of a removal.
	r.store.putShared(key, append([]byte{}, value...), r, time.Now().Add(ttl))
	return nil
}

// DeleteShared removes key, whichever registry put it.
func (r *Registry) DeleteShared(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: delete shared %q: %w", key, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("memory: delete shared %q: %w", key, kernel.ErrClosed)
	}
	r.store.removeShared(key, nil)
	return nil
}

// WatchShared gives fn every entry under prefix (in key order) before it
// returns, then every change from a goroutine of the watch, until ctx is
// done or the registry is closed. fn must not close the registry.
func (r *Registry) WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: watch shared %q: %w", prefix, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &sharedWatch{prefix: prefix, fn: fn, wake: make(chan struct{}, 1), cancel: cancel,
		done: make(chan struct{}), pending: make(map[string][]byte)}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return fmt.Errorf("memory: watch shared %q: %w", prefix, kernel.ErrClosed)
	}
	snapshot := r.store.watchShared(w)
	r.sharedWatches[w] = struct{}{}
	r.mu.Unlock()

	for _, kv := range snapshot {
		fn(kv.key, kv.value)
	}
	go r.runSharedWatch(wctx, w)
	return nil
}

func (r *Registry) runSharedWatch(ctx context.Context, w *sharedWatch) {
	defer close(w.done)
	defer func() {
		r.store.unwatchShared(w)
		r.mu.Lock()
		delete(r.sharedWatches, w)
		r.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		r.store.mu.Lock()
		order, pending := w.order, w.pending
		w.order, w.pending = nil, make(map[string][]byte)
		r.store.mu.Unlock()
		for _, k := range order {
			if ctx.Err() != nil {
				return
			}
			w.fn(k, bytes.Clone(pending[k]))
		}
	}
}

// endSharedWatches stops the shared watches started through r and waits
// for their goroutines, at Close.
func (r *Registry) endSharedWatches(watches map[*sharedWatch]struct{}) {
	for w := range watches {
		w.cancel()
	}
	for w := range watches {
		<-w.done
	}
}

type sharedKV struct {
	key   string
	value []byte
}

func (s *store) putShared(key string, value []byte, owner *Registry, expires time.Time) {
	s.mu.Lock()
	s.shared[key] = &sharedEntry{value: value, owner: owner, expires: expires}
	s.notifySharedLocked(key, value)
	s.wakeReaperLocked(expires)
	s.mu.Unlock()
}

// removeShared deletes key if owner put it last, or whoever did when owner
// is nil.
func (s *store) removeShared(key string, owner *Registry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeSharedLocked(key, owner)
}

func (s *store) removeSharedLocked(key string, owner *Registry) {
	e := s.shared[key]
	if e == nil || (owner != nil && e.owner != owner) {
		return
	}
	delete(s.shared, key)
	s.notifySharedLocked(key, nil)
}

// dropSharedOf removes every entry owner put last, at its Close.
func (s *store) dropSharedOf(owner *Registry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, e := range s.shared {
		if e.owner == owner {
			s.removeSharedLocked(key, owner)
		}
	}
}

// expireSharedLocked removes the entries whose ttl ended by now and
// returns the earliest expiry left (zero if none).
func (s *store) expireSharedLocked(now time.Time) time.Time {
	var next time.Time
	for key, e := range s.shared {
		if !e.expires.After(now) {
			s.removeSharedLocked(key, nil)
			continue
		}
		if next.IsZero() || e.expires.Before(next) {
			next = e.expires
		}
	}
	return next
}

// watchShared adds w and returns the entries under its prefix now, in key
// order: a change after this is queued for w, so none falls between.
func (s *store) watchShared(w *sharedWatch) []sharedKV {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sharedWatchers[w] = struct{}{}
	var out []sharedKV
	for key, e := range s.shared {
		if strings.HasPrefix(key, w.prefix) {
			out = append(out, sharedKV{key, bytes.Clone(e.value)})
		}
	}
	slices.SortFunc(out, func(a, b sharedKV) int { return strings.Compare(a.key, b.key) })
	return out
}

func (s *store) unwatchShared(w *sharedWatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sharedWatchers, w)
}

// notifySharedLocked queues key's new value (nil: removed) for every
// watcher of a prefix of key.
func (s *store) notifySharedLocked(key string, value []byte) {
	for w := range s.sharedWatchers {
		if !strings.HasPrefix(key, w.prefix) {
			continue
		}
		if _, queued := w.pending[key]; !queued {
			w.order = append(w.order, key)
		}
		w.pending[key] = value
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}
