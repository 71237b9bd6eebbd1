// Package consultest is an in-process stand-in for the part of Consul's
// HTTP API that the consul registry plugin uses, written from Consul's API
// documentation (developer.hashicorp.com/consul/api-docs), so that the
// plugin's tests run where no Consul agent can be installed. It is one
// agent that is also the whole catalog: a single node, no ACLs, no
// datacenters.
//
// What it serves, and how faithfully:
//
//   - PUT /v1/agent/service/register (with ?replace-existing-checks) and
//     PUT /v1/agent/service/deregister/:id. Meta is checked as Consul
//     checks it (64 pairs, keys of [A-Za-z0-9_-] up to 128 characters not
//     starting with "consul-", values up to 512 bytes). Only TTL checks are
//     supported; a new check is critical unless its Status says otherwise.
//   - PUT /v1/agent/check/update/:id ({Status, Output}) and
//     /v1/agent/check/pass|warn|fail/:id?note=: reset the check's TTL. An
//     unknown check is 404. A check not updated within its TTL turns
//     critical; a service whose check has been critical for
//     DeregisterCriticalServiceAfter (at least Options.MinDeregisterAfter,
//     Consul's 1m) is removed by a reaper that runs every
//     Options.ReapInterval (Consul's 30s).
//   - GET /v1/health/service/:service (?passing, ?index, ?wait): the
//     service's entries, only those whose checks all pass with ?passing.
//     As in Consul, the name matches services registered under any case
//     of it ("Echo" finds "echo"), each entry keeping its own.
//     X-Consul-Index is the index of the last change to that service
//     (registration, deregistration, a check's status, not its output,
//     as an agent syncs output changes lazily). With ?index=N the request
//     blocks until that index passes N or wait (default 5m, at most 10m,
//     plus up to wait/16 of jitter) elapses.
//   - PUT /v1/session/create, /v1/session/renew/:id, /v1/session/destroy/:id,
//     GET /v1/session/info/:id. A TTL must lie within
//     [Options.MinSessionTTL, 24h] (Consul's session_ttl_min, 10s by
//     default); an unrenewed session is invalidated at TTL ×
//     Options.SessionTTLMultiplier (Consul's 2) after its last renewal,
//     releasing (or, with behavior delete, deleting) its locks; a lock whose
//     session was invalidated cannot be acquired for the session's
//     lock-delay.
//   - GET, PUT and DELETE /v1/kv/:key, with ?acquire=, ?release=, ?cas=
//     (on PUT and DELETE), ?flags= and blocking GETs (?index, ?wait) on the
//     key; GET /v1/kv/:prefix?recurse lists every entry under the prefix
//     (404 when none), blocking on the last change under it, deletions
//     included, as Consul's tombstones make it.
//
// Every response carries X-Consul-KnownLeader and X-Consul-LastContact as
// an agent's do. Stop and Start take the agent away and bring it back on
// the same address; Wipe loses its state as an agent that restarted
// without its data directory would, and abandons the blocking queries
// (they return at once, with an index lower than the one they had).
package consultest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Options tune the stand-in's timing; zero values mean Consul's defaults.
type Options struct {
	// ReapInterval is how often critical services are reaped (30s).
	ReapInterval time.Duration
	// MinDeregisterAfter is the least DeregisterCriticalServiceAfter the
	// agent honours (1m).
	MinDeregisterAfter time.Duration
	// MinSessionTTL is the agent's session_ttl_min (10s).
	MinSessionTTL time.Duration
	// SessionTTLMultiplier is how many TTLs an unrenewed session outlives
	// its last renewal (2).
	SessionTTLMultiplier int
	// Tick is how often TTL checks and sessions are looked at (10ms).
	Tick time.Duration
}

func (o *Options) defaults() {
	if o.ReapInterval <= 0 {
		o.ReapInterval = 30 * time.Second
	}
	if o.MinDeregisterAfter <= 0 {
		o.MinDeregisterAfter = time.Minute
	}
	if o.MinSessionTTL <= 0 {
		o.MinSessionTTL = 10 * time.Second
	}
	if o.SessionTTLMultiplier <= 0 {
		o.SessionTTLMultiplier = 2
	}
	if o.Tick <= 0 {
		o.Tick = 10 * time.Millisecond
	}
}

// Server is a running stand-in agent.
type Server struct {
	opts Options
	addr string
	mux  *http.ServeMux

	quit chan struct{}
	wg   sync.WaitGroup

	lnMu  sync.Mutex
	srv   *http.Server // nil while stopped
	srvWG sync.WaitGroup

	mu       sync.Mutex
	st       *state
	changed  chan struct{} // closed and replaced at every change
	abandon  chan struct{} // closed and replaced by Wipe
	lastReap time.Time
	requests map[string]int // by endpoint, e.g. "PUT /v1/agent/service/register"
}

// New starts a stand-in on a free loopback port; Close stops it.
func New(opts Options) (*Server, error) {
	opts.defaults()
	s := &Server{
		opts: opts, quit: make(chan struct{}), st: newState(),
		changed: make(chan struct{}), abandon: make(chan struct{}),
		lastReap: time.Now(), requests: make(map[string]int),
	}
	s.mux = s.routes()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("consultest: listen: %w", err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	s.wg.Go(s.ticker)
	return s, nil
}

// Addr is the agent's host:port.
func (s *Server) Addr() string { return s.addr }

func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
	s.srv = srv
	s.srvWG.Go(func() { srv.Serve(ln) })
}

// Stop closes the listener and every connection, as a dead agent would;
// blocking queries in flight end with the connection.
func (s *Server) Stop() {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Close()
	s.srvWG.Wait()
	s.srv = nil
}

// Start listens again on the same address after Stop.
func (s *Server) Start() error {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("consultest: listen again on %s: %w", s.addr, err)
	}
	s.serve(ln)
	return nil
}

// Wipe forgets every service, check, session and key, restarts the index
// low, and makes every blocking query return at once.
func (s *Server) Wipe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = newState()
	close(s.abandon)
	s.abandon = make(chan struct{})
	s.notifyLocked()
}

// Close stops the stand-in and its goroutines.
func (s *Server) Close() {
	s.Stop()
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	s.wg.Wait()
}

// Requests returns how many requests the stand-in has served on an
// endpoint, named as "METHOD /path" without the trailing ID, e.g.
// "PUT /v1/agent/service/register" or "PUT /v1/agent/check/update".
func (s *Server) Requests(endpoint string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[endpoint]
}

// notifyLocked wakes every blocking query; s.mu is held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// ticker turns expired TTL checks critical, invalidates expired sessions
// and reaps critical services.
func (s *Server) ticker() {
	t := time.NewTicker(s.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case now := <-t.C:
			s.mu.Lock()
			changed := s.st.expireChecks(now)
			changed = s.st.expireSessions(now, s.opts.SessionTTLMultiplier) || changed
			if now.Sub(s.lastReap) >= s.opts.ReapInterval {
				s.lastReap = now
				changed = s.st.reap(now, s.opts.MinDeregisterAfter) || changed
			}
			if changed {
				s.notifyLocked()
			}
			s.mu.Unlock()
		}
	}
}

// block waits, for a request with ?index=N, until current() passes N, the
// wait elapses, the query is abandoned or the client goes away; it returns
// with s.mu held.
func (s *Server) block(r *http.Request, current func() uint64) error {
	q := r.URL.Query()
	s.mu.Lock()
	if !q.Has("index") {
		return nil
	}
	var index uint64
	if _, err := fmt.Sscan(q.Get("index"), &index); err != nil {
		return fmt.Errorf("invalid index %q", q.Get("index"))
	}
	wait := 5 * time.Minute
	if w := q.Get("wait"); w != "" {
		d, err := parseWait(w)
		if err != nil {
			return err
		}
		wait = min(d, 10*time.Minute)
	}
	wait += jitter(wait / 16)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	abandon := s.abandon
	for index > 0 && current() <= index {
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-abandon:
			s.mu.Lock()
			return nil
		case <-deadline.C:
			s.mu.Lock()
			return nil
		case <-r.Context().Done():
			s.mu.Lock()
			return r.Context().Err()
		case <-s.quit:
			s.mu.Lock()
			return errors.New("shutting down")
		}
		s.mu.Lock()
	}
	return nil
}

// parseWait reads a wait as Consul does: a duration with a unit, or a
// number of seconds.
func parseWait(w string) (time.Duration, error) {
	if d, err := time.ParseDuration(w); err == nil && d >= 0 {
		return d, nil
	}
	var secs uint64
	if _, err := fmt.Sscan(w, &secs); err == nil && !strings.ContainsAny(w, ".-") {
		return time.Duration(secs) * time.Second, nil
	}
	return 0, fmt.Errorf("invalid wait time %q", w)
}
