package consultest

import (
	"crypto/rand"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"time"
)

// nodeName is the stand-in's one node.
const nodeName = "consultest"

// state is everything the agent knows; Server.mu guards it.
type state struct {
	index    uint64              // the last index handed out
	services map[string]*service // by service ID
	names    map[string]uint64   // lower-cased service name -> index of its last change
	sessions map[string]*session
	kv       map[string]*kvEntry
	kvIndex  map[string]uint64 // key -> index of its last change, deletions included
}

type service struct {
	ID, Name, Address string
	Port              int
	Tags              []string
	Meta              map[string]string
	Check             *check // nil: no check, always passing
	CreateIndex       uint64
	ModifyIndex       uint64
}

type check struct {
	ID, Name, Status, Output string
	TTL                      time.Duration
	DeregisterAfter          time.Duration
	expires                  time.Time // TTL deadline
	criticalSince            time.Time
}

type session struct {
	ID, Name, Node, Behavior, TTLText string
	TTL, LockDelay                    time.Duration
	renewed                           time.Time
	CreateIndex                       uint64
}

type kvEntry struct {
	Key                                 string
	Value                               []byte
	Flags                               uint64
	Session                             string
	LockIndex, CreateIndex, ModifyIndex uint64
	lockDelayUntil                      time.Time
}

func newState() *state {
	return &state{
		// Not 0: Consul's indexes start well above it, and a client must
		// never be told 0.
		index:    uint64(10 + mrand.IntN(10)),
		services: make(map[string]*service), names: make(map[string]uint64),
		sessions: make(map[string]*session), kv: make(map[string]*kvEntry), kvIndex: make(map[string]uint64),
	}
}

func (st *state) next() uint64 { st.index++; return st.index }

// serviceIndex is the X-Consul-Index of a health query on name. Consul
// looks a service up by its name regardless of case (see byName), so the
// index is kept per lower-cased name.
func (st *state) serviceIndex(name string) uint64 { return max(st.names[strings.ToLower(name)], 1) }

func (st *state) touchService(name string) { st.names[strings.ToLower(name)] = st.next() }

var metaKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// validateMeta checks Meta as Consul's agent does.
func validateMeta(meta map[string]string) error {
	if len(meta) > 64 {
		return fmt.Errorf("Node metadata cannot contain more than 64 key/value pairs")
	}
	for k, v := range meta {
		switch {
		case k == "":
			return fmt.Errorf("Key cannot be blank")
		case !metaKey.MatchString(k):
			return fmt.Errorf("Key contains invalid characters")
		case len(k) > 128:
			return fmt.Errorf("Key is too long (limit: 128 characters)")
		case strings.HasPrefix(k, "consul-"):
			return fmt.Errorf("Key prefix 'consul-' is reserved for internal use")
		case len(v) > 512:
			return fmt.Errorf("Value is too long (limit: 512 characters)")
		}
	}
	return nil
}

// register adds or replaces svc. A check that existed keeps its status
// unless the registration gives one.
func (st *state) register(svc *service, now time.Time) {
	if old := st.services[svc.ID]; old != nil {
		svc.CreateIndex = old.CreateIndex
		if !strings.EqualFold(old.Name, svc.Name) {
			st.touchService(old.Name)
		}
		if svc.Check != nil && old.Check != nil && old.Check.ID == svc.Check.ID && svc.Check.Status == "" {
			svc.Check.Status = old.Check.Status
		}
	}
	if c := svc.Check; c != nil {
		if c.Status == "" {
			c.Status = "critical"
		}
		c.expires = now.Add(c.TTL)
		if c.Status == "critical" {
			c.criticalSince = now
		}
	}
	st.touchService(svc.Name)
	svc.ModifyIndex = st.names[strings.ToLower(svc.Name)]
	if svc.CreateIndex == 0 {
		svc.CreateIndex = svc.ModifyIndex
	}
	st.services[svc.ID] = svc
}

func (st *state) deregister(id string) bool {
	svc := st.services[id]
	if svc == nil {
		return false
	}
	delete(st.services, id)
	st.touchService(svc.Name)
	return true
}

// checkByID finds a check and its service.
func (st *state) checkByID(id string) (*service, *check) {
	for _, svc := range st.services {
		if svc.Check != nil && svc.Check.ID == id {
			return svc, svc.Check
		}
	}
	return nil, nil
}

// updateCheck sets a TTL check's status and resets its TTL; only a change
// of status moves the service's index.
func (st *state) updateCheck(svc *service, c *check, status, output string, now time.Time) bool {
	c.expires = now.Add(c.TTL)
	c.Output = output
	if c.Status == status {
		return false
	}
	c.Status = status
	if status == "critical" {
		c.criticalSince = now
	}
	st.touchService(svc.Name)
	return true
}

func (st *state) expireChecks(now time.Time) bool {
	changed := false
	for _, svc := range st.services {
		if c := svc.Check; c != nil && c.Status != "critical" && !now.Before(c.expires) {
			c.Status, c.Output, c.criticalSince = "critical", "TTL expired", now
			st.touchService(svc.Name)
			changed = true
		}
	}
	return changed
}

// reap removes services critical for longer than their check allows.
func (st *state) reap(now time.Time, minAfter time.Duration) bool {
	changed := false
	for id, svc := range st.services {
		c := svc.Check
		if c == nil || c.DeregisterAfter <= 0 || c.Status != "critical" {
			continue
		}
		if now.Sub(c.criticalSince) >= max(c.DeregisterAfter, minAfter) {
			changed = st.deregister(id) || changed
		}
	}
	return changed
}

// passing is whether every check of svc passes (the node's own check
// always does here).
func (svc *service) passing() bool { return svc.Check == nil || svc.Check.Status == "passing" }

// byName returns the services of a name sorted by ID. As in Consul, the
// name matches regardless of case, and each service keeps the case it was
// registered with: /v1/health/service/Echo also returns the instances
// registered as "echo" (hashicorp/consul#5707: the catalog's list of
// services is case-sensitive, the lookups of one service, health, catalog
// and DNS, are not).
func (st *state) byName(name string) []*service {
	var out []*service
	for _, svc := range st.services {
		if strings.EqualFold(svc.Name, name) {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b *service) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// invalidate ends a session: its locks are released (or their keys
// deleted, with behavior delete) and blocked for its lock-delay.
func (st *state) invalidate(id string, now time.Time) {
	sess := st.sessions[id]
	if sess == nil {
		return
	}
	delete(st.sessions, id)
	for key, e := range st.kv {
		if e.Session != id {
			continue
		}
		if sess.Behavior == "delete" {
			delete(st.kv, key)
			st.kvIndex[key] = st.next()
			continue
		}
		e.Session = ""
		e.lockDelayUntil = now.Add(sess.LockDelay)
		e.ModifyIndex = st.next()
		st.kvIndex[key] = e.ModifyIndex
	}
}

func (st *state) expireSessions(now time.Time, multiplier int) bool {
	changed := false
	for id, sess := range st.sessions {
		if sess.TTL > 0 && now.Sub(sess.renewed) >= sess.TTL*time.Duration(multiplier) {
			st.invalidate(id, now)
			changed = true
		}
	}
	return changed
}

func (st *state) keyIndex(key string) uint64 { return max(st.kvIndex[key], 1) }

// prefixIndex is the last change to a key under prefix, deletions
// included.
func (st *state) prefixIndex(prefix string) uint64 {
	var idx uint64 = 1
	for key, i := range st.kvIndex {
		if strings.HasPrefix(key, prefix) {
			idx = max(idx, i)
		}
	}
	return idx
}

// under lists the entries whose keys start with prefix, by key.
func (st *state) under(prefix string) []*kvEntry {
	var out []*kvEntry
	for key, e := range st.kv {
		if strings.HasPrefix(key, prefix) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *kvEntry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func (st *state) putKey(key string, value []byte, flags uint64) *kvEntry {
	e := st.kv[key]
	idx := st.next()
	if e == nil {
		e = &kvEntry{Key: key, CreateIndex: idx}
		st.kv[key] = e
	}
	e.Value, e.Flags, e.ModifyIndex = slices.Clone(value), flags, idx
	st.kvIndex[key] = idx
	return e
}

func cloneMeta(m map[string]string) map[string]string { return maps.Clone(m) }

// jitter is a random duration in [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return mrand.N(d + 1)
}
