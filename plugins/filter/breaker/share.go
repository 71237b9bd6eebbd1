package breaker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

var (
	_ kernel.PluginsObserver = (*Filter)(nil)
	_ io.Closer              = (*Filter)(nil)
)

// sharing links a filter to the breaker state every client of its
// share_namespace sees (share: registry), through the client's registry
// (kernel.SharedStore). An opening is published off the call path: the
// circuit queues it, without waiting, for the filter's publisher
// goroutine. A peer's opening arrives through the watch and opens this
// filter's circuit for the same key until the peer's time.
type sharing struct {
	f *Filter
	// origin tells this filter's own entries apart when the watch gives
	// them back: they change nothing here.
	origin string
	ttl    time.Duration // open_duration + shareMargin

	observed atomic.Bool // ObservePlugins ran
	active   atomic.Bool // a SharedStore was found: openings are published
	store    kernel.SharedStore
	out      chan shareOp // to the publisher; full means dropped

	dropped atomic.Uint64 // openings and closings not published: the queue was full
	failed  atomic.Uint64 // publications the registry refused

	ctx     context.Context // ends with Close: the watch and the publisher
	cancel  context.CancelFunc
	running sync.WaitGroup
}

// shareQueue bounds the openings and closings waiting to be published;
// a burst larger than this (every instance failing at once) loses the
// newest, which the other clients then find on their own.
const shareQueue = 64

// shareMargin is how long a published opening outlives its open-until
// time, so that a registry that counts ttls in whole seconds (etcd) does
// not drop it early; a stale entry is ignored by its time anyway.
const shareMargin = time.Second

// shareTimeout bounds one publication.
const shareTimeout = 5 * time.Second

// shareOp is one publication: an opening (put) or a closing (delete).
type shareOp struct {
	key   key
	del   bool
	value sharedValue
}

// sharedValue is what a published opening holds (JSON).
type sharedValue struct {
	// OpenUntil is when the opening client lets probes through, on the
	// wall clock (unix ns): clients compare it with their own clocks.
	OpenUntil int64 `json:"open_until_unix_nano"`
	// Failures of Calls is what opened it; 0 of 0 for a failed probe.
	Failures int    `json:"failures"`
	Calls    int    `json:"calls"`
	Origin   string `json:"origin"`
}

func newSharing(f *Filter) *sharing {
	ctx, cancel := context.WithCancel(context.Background())
	return &sharing{
		f:      f,
		origin: strconv.FormatUint(rand.Uint64(), 36),
		ttl:    time.Duration(f.cfg.open) + shareMargin,
		out:    make(chan shareOp, shareQueue),
		ctx:    ctx,
		cancel: cancel,
	}
}

// ObservePlugins finds, with share: registry, the client's registry and
// starts following the shared state through it. A registry that cannot
// share (not a kernel.SharedStore) fails no call: the filter logs an
// error, once, and keeps its state to itself. On the server side it does
// nothing, as the filter passes calls through there.
func (f *Filter) ObservePlugins(refs []kernel.PluginRef) {
	if f.share != nil && !f.share.observed.Swap(true) {
		f.share.observe(refs)
	}
}

// Close stops following the shared state and the publisher; what is
// still queued is not published (its entries expire). It is idempotent.
func (f *Filter) Close() error {
	if f.share != nil {
		f.share.cancel()
		f.share.running.Wait()
	}
	return nil
}

func (s *sharing) observe(refs []kernel.PluginRef) {
	var registry *kernel.PluginRef
	for i, r := range refs {
		if r.Side != kernel.ClientSide {
			return
		}
		if r.Kind == kernel.KindRegistry {
			registry = &refs[i]
		}
	}
	if registry == nil {
		s.f.log.Error("breaker: share: registry, but the client has no registry; each client keeps its own breaker state")
		return
	}
	store, ok := registry.Plugin.(kernel.SharedStore)
	if !ok {
		s.f.log.Error("breaker: share: registry, but the client's registry cannot share state (it does not implement "+
			"kernel.SharedStore); each client keeps its own breaker state", "registry", registry.Name)
		return
	}
	s.store = store
	s.active.Store(true)
	s.running.Add(1)
	go s.publish()
	// The first try in line, so that a client's first call already knows
	// the openings of the others; retried in the background if it fails.
	if err := s.store.WatchShared(s.ctx, s.f.cfg.sharePrefix, s.received); err != nil {
		s.f.log.Warn("breaker: share: cannot follow the shared breaker state yet; retrying", "registry", registry.Name, "err", err)
		s.running.Add(1)
		go s.retryWatch(registry.Name)
	}
}

func (s *sharing) retryWatch(registry string) {
	defer s.running.Done()
	wait := time.Second
	for {
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := s.store.WatchShared(s.ctx, s.f.cfg.sharePrefix, s.received)
		if err == nil || s.ctx.Err() != nil {
			return
		}
		wait = min(2*wait, 30*time.Second)
		s.f.log.Warn("breaker: share: cannot follow the shared breaker state; retrying", "registry", registry, "err", err, "in", wait)
	}
}

// publish writes the queued openings and closings, until Close.
func (s *sharing) publish() {
	defer s.running.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case op := <-s.out:
			s.write(op)
		}
	}
}

func (s *sharing) write(op shareOp) {
	ctx, cancel := context.WithTimeout(s.ctx, shareTimeout)
	defer cancel()
	k := s.sharedKey(op.key)
	var err error
	if op.del {
		err = s.store.DeleteShared(ctx, k)
	} else {
		v, _ := json.Marshal(op.value) // a struct of numbers and a string: cannot fail
		err = s.store.PutShared(ctx, k, v, s.ttl)
	}
	// A registry closed first (the client closes it before its filters)
	// is the client closing, not a failure.
	if err != nil && s.ctx.Err() == nil && !errors.Is(err, kernel.ErrClosed) {
		s.failed.Add(1)
		s.f.log.Warn("breaker: share: could not publish a breaker's state", "circuit", describe(op.key), "key", k, "err", err)
	}
}

// enqueue hands op to the publisher without waiting: a call never waits
// on the registry.
func (s *sharing) enqueue(op shareOp) {
	select {
	case s.out <- op:
	default:
		s.dropped.Add(1)
	}
}

// opened publishes that the circuit for k opened at now (the filter's
// clock) until until. Called with the circuit's lock held.
func (s *sharing) opened(k key, now, until int64, failures, calls int) {
	if s == nil || !s.active.Load() {
		return
	}
	s.enqueue(shareOp{key: k, value: sharedValue{
		OpenUntil: s.f.wall() + (until - now), Failures: failures, Calls: calls, Origin: s.origin,
	}})
}

// closed withdraws k's opening once its probes succeeded. The others'
// circuits stay open until the time they were given, then probe on
// their own.
func (s *sharing) closed(k key) {
	if s == nil || !s.active.Load() {
		return
	}
	s.enqueue(shareOp{key: k, del: true})
}

// received is the watch's fn: an opening of another client opens this
// filter's circuit for the same key until its time, or for open_duration
// + shareMargin if that is sooner. Removals, expired
// openings, this filter's own and keys of another scope change nothing.
func (s *sharing) received(sk string, value []byte) {
	if value == nil {
		return
	}
	k, ok := s.parseKey(sk)
	if !ok {
		return
	}
	var v sharedValue
	if err := json.Unmarshal(value, &v); err != nil {
		s.f.log.Warn("breaker: share: skipping a shared entry that is not a breaker's opening", "key", sk, "err", err)
		return
	}
	if v.Origin == s.origin {
		return
	}
	// Compared before subtracting: an open-until far in the past (a
	// corrupt or foreign entry) would wrap around into a huge opening.
	wall := s.f.wall()
	if v.OpenUntil <= wall {
		return
	}
	// Capped at what an opening of this filter's own lasts, plus the
	// margin its entry outlives it by: a peer whose wall clock runs ahead
	// (a VM booted before NTP set its clock) or a corrupt entry would
	// otherwise shut the instance out for as long as it says, years even,
	// since removals change nothing and an open circuit keeps the later
	// time.
	left := min(v.OpenUntil-wall, s.f.cfg.open+int64(shareMargin))
	if c, ok := s.f.store.lookup(k).(*ratioCircuit); ok {
		now := s.f.now()
		c.peerOpen(now, now+left, v)
	}
}

// sharedKey is k's key in the shared store:
// breaker/<share_namespace>/<method>|<host>, each part path-escaped (so
// that neither holds "/" or "|"); the part the scope leaves out is empty.
func (s *sharing) sharedKey(k key) string {
	return s.f.cfg.sharePrefix + url.PathEscape(k.method) + "|" + url.PathEscape(k.host)
}

// parseKey is sharedKey's inverse; a key of another scope than the
// filter's is not one of its circuits.
func (s *sharing) parseKey(sk string) (key, bool) {
	rest, ok := strings.CutPrefix(sk, s.f.cfg.sharePrefix)
	if !ok {
		return key{}, false
	}
	m, h, ok := strings.Cut(rest, "|")
	if !ok {
		return key{}, false
	}
	var k key
	var err1, err2 error
	k.method, err1 = url.PathUnescape(m)
	k.host, err2 = url.PathUnescape(h)
	if err1 != nil || err2 != nil || (k.method != "") != s.f.cfg.byMethod || (k.host != "") != s.f.cfg.byHost {
		return key{}, false
	}
	return k, true
}

// peerOpen opens the circuit until until (the filter's clock) because
// another client opened its own: a closed or half-open circuit opens (its
// probes in flight become stale), an open one stays open until the later
// of the two times. It is not published again.
func (c *ratioCircuit) peerOpen(now, until int64, v sharedValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if State(c.sg.Load()&3) == Open {
		c.openUntil = max(c.openUntil, until)
		return
	}
	c.set(Open)
	c.opened.Add(1)
	c.peerOpened.Add(1)
	c.openUntil = until
	why := "a probe call failed there"
	if v.Calls > 0 {
		why = strconv.Itoa(v.Failures) + " of " + strconv.Itoa(v.Calls) + " calls failed there"
	}
	c.openErr = rejection(c.key, fmt.Sprintf("breaker: circuit for %s is open: another client sharing its breaker state "+
		"through the registry opened it (%s); it lets %d probe calls through %s after this client heard of it",
		describe(c.key), why, c.cfg.probes, time.Duration(until-now).Round(time.Millisecond)))
	c.win.reset()
	c.log.Warn("breaker: opened by another client", "circuit", describe(c.key),
		"open_for", time.Duration(until-now).Round(time.Millisecond), "failures", v.Failures, "calls", v.Calls)
}
