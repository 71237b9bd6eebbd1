package breaker

import (
	"strings"
	"sync"
	"sync/atomic"
)

// key names one breaker: the method, the instance's address, or both,
// as the scope says; the part the scope leaves out is empty.
type key struct {
	method, host string
}

// store holds the circuits of one filter, one per key. localStore keeps
// them in this process, each client judging the instances by its own
// calls. A store shared by every client of a service (through etcd, once
// the etcd registry module exists) would implement the same method: its
// circuits would publish their counts and transitions and read the
// others', so that one client learns what the others saw.
type store interface {
	lookup(k key) circuit
	// each calls fn for every circuit the store holds, without marking
	// it used: reading the state must not keep an idle circuit alive.
	each(fn func(k key, c circuit))
}

// localStore is a copy-on-write map: a lookup is one atomic load and a
// map access, with no lock and no allocation; a new key copies the map.
type localStore struct {
	newCircuit func(k key) circuit

	m       atomic.Pointer[map[key]*entry]
	mu      sync.Mutex // serializes copies
	sweepAt int        // the size at which the next copy drops idle circuits
}

type entry struct {
	c    circuit
	used atomic.Bool // looked up since the last sweep
}

// minSweep is the size below which idle circuits are kept.
const minSweep = 64

func newLocalStore(newCircuit func(k key) circuit) *localStore {
	s := &localStore{newCircuit: newCircuit, sweepAt: minSweep}
	m := map[key]*entry{}
	s.m.Store(&m)
	return s
}

func (s *localStore) lookup(k key) circuit {
	if e, ok := (*s.m.Load())[k]; ok {
		if !e.used.Load() {
			e.used.Store(true)
		}
		return e.c
	}
	return s.add(k)
}

// add makes the circuit for k. Instances come and go, so once the map has
// grown to sweepAt, the copy leaves out the circuits nobody looked up since
// the previous sweep (those of instances that left).
func (s *localStore) add(k key) circuit {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	if e, ok := old[k]; ok {
		return e.c
	}
	sweep := len(old) >= s.sweepAt
	next := make(map[key]*entry, len(old)+1)
	for k, e := range old {
		if sweep {
			if !e.used.Load() {
				continue
			}
			e.used.Store(false)
		}
		next[k] = e
	}
	if sweep {
		s.sweepAt = max(minSweep, 2*len(next))
	}
	// The key outlives the call: own its strings.
	k = key{method: strings.Clone(k.method), host: strings.Clone(k.host)}
	e := &entry{c: s.newCircuit(k)}
	e.used.Store(true)
	next[k] = e
	s.m.Store(&next)
	return e.c
}

// size is how many circuits the store holds.
func (s *localStore) size() int { return len(*s.m.Load()) }

func (s *localStore) each(fn func(k key, c circuit)) {
	for k, e := range *s.m.Load() {
		fn(k, e.c)
	}
}
