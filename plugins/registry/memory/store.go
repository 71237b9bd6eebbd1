package memory

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// stores holds the store of every namespace some open Registry uses. A
// store lives while at least one Registry holds it.
var stores = struct {
	sync.Mutex
	m map[string]*store
}{m: make(map[string]*store)}

func acquireStore(namespace string) *store {
	stores.Lock()
	defer stores.Unlock()
	s := stores.m[namespace]
	if s == nil {
		s = newStore(namespace)
		stores.m[namespace] = s
	}
	s.refs++
	return s
}

func releaseStore(s *store) {
	stores.Lock()
	s.refs--
	last := s.refs == 0
	if last {
		delete(stores.m, s.namespace)
	}
	stores.Unlock()
	if !last {
		return
	}
	s.mu.Lock()
	reaper := s.reaper
	s.mu.Unlock()
	if reaper != nil {
		reaper.stop()
	}
}

type instanceKey struct{ service, id string }

// entry is one registered instance under its lease.
type entry struct {
	inst    kernel.Instance // Metadata is the store's own copy, never changed in place
	owner   *Registry       // the registry that keeps the lease
	expires time.Time       // zero while the owner keeps the lease
}

// serviceState is what the store knows of one service name.
type serviceState struct {
	entries  map[string]*entry // by instance ID
	watchers map[*watcher]struct{}
}

// store is the in-process backend of one namespace: the instances every
// Registry of the namespace registered, and the watches on them.
type store struct {
	namespace string
	refs      int        // open registries; guarded by stores' mutex
	reaper    *timedLoop // nil until the first lease (s.mu)

	mu       sync.Mutex
	services map[string]*serviceState
	// The shared store (shared.go): entries by key, and their watches.
	shared         map[string]*sharedEntry
	sharedWatchers map[*sharedWatch]struct{}
}

func newStore(namespace string) *store {
	s := &store{namespace: namespace, services: make(map[string]*serviceState),
		shared: make(map[string]*sharedEntry), sharedWatchers: make(map[*sharedWatch]struct{})}
	return s
}

func (s *store) serviceLocked(name string) *serviceState {
	svc := s.services[name]
	if svc == nil {
		svc = &serviceState{entries: make(map[string]*entry), watchers: make(map[*watcher]struct{})}
		s.services[name] = svc
	}
	return svc
}

func (s *store) dropIfUnusedLocked(name string, svc *serviceState) {
	if len(svc.entries) == 0 && len(svc.watchers) == 0 {
		delete(s.services, name)
	}
}

// put stores inst for owner; expires is zero while owner keeps the lease.
func (s *store) put(inst kernel.Instance, owner *Registry, expires time.Time) {
	s.mu.Lock()
	svc := s.serviceLocked(inst.Service)
	svc.entries[inst.ID] = &entry{inst: inst, owner: owner, expires: expires}
	s.notifyLocked(inst.Service, svc)
	s.wakeReaperLocked(expires)
	s.mu.Unlock()
}

// wakeReaperLocked has the store's expiry reaper look again, if expires
// is set. s.mu is held.
func (s *store) wakeReaperLocked(expires time.Time) {
	if !expires.IsZero() {
		s.reaperLocked().wake()
	}
}

// reaperLocked returns the store's expiry reaper, starting it with the
// first lease left to expire: a store whose leases are all kept (a
// server's) or that is only watched (a client's) needs none, so neither
// starts a goroutine for it. s.mu is held.
func (s *store) reaperLocked() *timedLoop {
	if s.reaper == nil {
		s.reaper = startExpiryReaper(s)
	}
	return s.reaper
}

// remove deletes key if owner registered it, or whoever did when owner is
// nil.
func (s *store) remove(key instanceKey, owner *Registry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc, e := s.lookupLocked(key)
	if e == nil || (owner != nil && e.owner != owner) {
		return
	}
	delete(svc.entries, key.id)
	s.notifyLocked(key.service, svc)
	s.dropIfUnusedLocked(key.service, svc)
}

// lookupLocked finds key's service and entry; either may be nil.
func (s *store) lookupLocked(key instanceKey) (*serviceState, *entry) {
	svc := s.services[key.service]
	if svc == nil {
		return nil, nil
	}
	return svc, svc.entries[key.id]
}

// setExpiry has key expire at expires if owner still holds its lease.
func (s *store) setExpiry(key instanceKey, owner *Registry, expires time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, e := s.lookupLocked(key)
	if e == nil || e.owner != owner {
		return false
	}
	e.expires = expires
	s.wakeReaperLocked(expires)
	return true
}

func (s *store) setLoad(key instanceKey, load kernel.Load) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc, e := s.lookupLocked(key)
	if e == nil {
		return false
	}
	e.inst.Load = load
	s.notifyLocked(key.service, svc)
	return true
}

// expire removes the entries whose lease ended by now (instances and
// shared entries), tells their watchers, and returns the earliest expiry
// left (zero if none).
func (s *store) expire(now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.expireSharedLocked(now)
	for name, svc := range s.services {
		changed := false
		for id, e := range svc.entries {
			if e.expires.IsZero() {
				continue // its lease is kept
			}
			if !e.expires.After(now) {
				delete(svc.entries, id)
				changed = true
				continue
			}
			if next.IsZero() || e.expires.Before(next) {
				next = e.expires
			}
		}
		if changed {
			s.notifyLocked(name, svc)
			s.dropIfUnusedLocked(name, svc)
		}
	}
	return next
}

// liveLocked returns a fresh copy of service's registered instances, sorted
// by ID.
func (s *store) liveLocked(name string) []kernel.Instance {
	svc := s.services[name]
	if svc == nil {
		return nil
	}
	out := make([]kernel.Instance, 0, len(svc.entries))
	for _, e := range svc.entries {
		out = append(out, e.inst)
	}
	slices.SortFunc(out, func(a, b kernel.Instance) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// withStatic returns a new slice of static then live, with every Metadata
// map copied so that callers may keep and change what they get.
func withStatic(static, live []kernel.Instance) []kernel.Instance {
	out := make([]kernel.Instance, 0, len(static)+len(live))
	out = append(out, static...)
	out = append(out, live...)
	for i := range out {
		out[i].Metadata = maps.Clone(out[i].Metadata)
	}
	return out
}

func (s *store) notifyLocked(name string, svc *serviceState) {
	if len(svc.watchers) == 0 {
		return
	}
	live := s.liveLocked(name)
	for w := range svc.watchers {
		w.sendLocked(withStatic(w.static, live))
	}
}

// watch adds w and returns the service's instances as w sees them now,
// which a Watch's channel is sent at once, under the same lock as any
// change, so that the first set cannot overtake a later one.
func (s *store) watch(w *watcher) []kernel.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.serviceLocked(w.service)
	svc.watchers[w] = struct{}{}
	set := withStatic(w.static, s.liveLocked(w.service))
	if w.ch != nil {
		w.sendLocked(set)
	}
	return set
}

// unwatch ends w: it closes a Watch's channel, or stops a Notify's
// deliveries and waits for one in progress. It is idempotent.
func (s *store) unwatch(w *watcher) {
	s.mu.Lock()
	ended := w.ended
	if !ended {
		w.ended = true
		if w.ch != nil {
			close(w.ch)
		}
		if svc := s.services[w.service]; svc != nil {
			delete(svc.watchers, w)
			s.dropIfUnusedLocked(w.service, svc)
		}
	}
	s.mu.Unlock()
	// Outside s.mu: a delivery in progress may be resolving.
	if w.notify != nil {
		w.notify.stop()
	}
}

// watcher is one Watch or Notify. Only the store hands it sets, under
// store.mu, so a send after draining the one-slot buffer never blocks.
type watcher struct {
	service string
	static  []kernel.Instance
	ch      chan []kernel.Instance // Watch's, capacity 1: the latest unread set
	notify  *notifier              // Notify's; ch is nil then
	ended   bool                   // guarded by store.mu
}

// sendLocked replaces any set the receiver has not taken yet with set.
func (w *watcher) sendLocked(set []kernel.Instance) {
	if w.ended {
		return
	}
	if w.notify != nil {
		w.notify.hand(set)
		return
	}
	select {
	case <-w.ch: // stale, unread: the latest set wins
	default:
	}
	select {
	case w.ch <- set:
	default: // unreachable: the store is the only sender and just emptied ch
	}
}

// startExpiryReaper starts the goroutine that removes s's instances whose
// lease ended, at the earliest expiry, whether or not anyone resolves.
func startExpiryReaper(s *store) *timedLoop {
	return startTimedLoop(func(now time.Time) (time.Duration, bool) {
		next := s.expire(now)
		return next.Sub(now), !next.IsZero()
	})
}
