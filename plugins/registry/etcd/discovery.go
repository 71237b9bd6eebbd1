package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kernrpc/kernrpc/kernel"
)

// serviceCache is what a registry knows of one service: the instances, as
// of revision rev, kept current by one watch on the service's prefix, and
// the Watch channels to tell of every change.
type serviceCache struct {
	r       *Registry
	service string
	prefix  string // <prefix><service>/

	ready chan struct{} // closed once the first read is done; err says how
	err   error

	mu     sync.Mutex
	byID   map[string]kernel.Instance
	mods   map[string]int64  // every key under the prefix (instances or not): its ModRevision, as of rev
	set    []kernel.Instance // sorted by ID; never changed once published
	rev    int64             // the revision set is current at
	subs   map[*subscriber]struct{}
	closed bool // the registry closed: no more subscribers
}

// subscriber is one Watch channel: capacity one, so a slow reader holds at
// most one set, and it is replaced by the latest.
type subscriber struct {
	ch     chan []kernel.Instance
	closed bool
}

// Resolve returns service's instances from the local cache. The first
// Resolve (or Watch) of a service reads it from etcd once, within
// dial_timeout; after that Resolve never waits on etcd, and while etcd is
// unreachable it answers with the last set it saw.
func (r *Registry) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	if err := r.usable(ctx, "resolve "+service); err != nil {
		return nil, err
	}
	c, err := r.cache(ctx, service, "resolve")
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneSet(c.set), nil
}

// Watch sends service's instances now and after every change (a
// registration, a deregistration, an expiry, a new value), until ctx is
// done or the registry closes; then it closes the channel. A slow receiver
// gets only the latest set.
func (r *Registry) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	if err := r.usable(ctx, "watch "+service); err != nil {
		return nil, err
	}
	c, err := r.cache(ctx, service, "watch")
	if err != nil {
		return nil, err
	}
	s := &subscriber{ch: make(chan []kernel.Instance, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("%s: watch %s: %w", Name, service, kernel.ErrClosed)
	}
	c.subs[s] = struct{}{}
	s.ch <- cloneSet(c.set)
	c.mu.Unlock()
	context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.endLocked(s)
	})
	return s.ch, nil
}

// cache returns service's cache, reading the service and starting its
// watch if this is the first call that asks for it. A first read that
// fails leaves no cache behind, so that the next call tries again.
func (r *Registry) cache(ctx context.Context, service, op string) (*serviceCache, error) {
	if err := checkService(op, service); err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, fmt.Errorf("%s: %s %s: %w", Name, op, service, kernel.ErrClosed)
	}
	c := r.services[service]
	if c == nil {
		c = &serviceCache{
			r: r, service: service, prefix: r.opts.Prefix + service + "/",
			ready: make(chan struct{}), byID: make(map[string]kernel.Instance), mods: make(map[string]int64),
			subs: make(map[*subscriber]struct{}),
		}
		r.services[service] = c
		r.caches.Add(1)
		go c.run()
	}
	r.mu.Unlock()
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %s %s: %w", Name, op, service, context.Cause(ctx))
	}
	if c.err != nil {
		return nil, c.err // it names the service's prefix and what etcd did
	}
	return c, nil
}

// run reads the service, then follows it until the registry closes.
func (c *serviceCache) run() {
	defer c.r.caches.Done()
	_, gen := c.r.nextReconnect()
	err := c.readAll(c.r.ctx)
	if err != nil {
		c.err = err
		c.r.mu.Lock()
		if c.r.services[c.service] == c {
			delete(c.r.services, c.service)
		}
		c.r.mu.Unlock()
	}
	close(c.ready)
	if err != nil {
		return
	}
	c.r.follow(c.r.ctx, c, gen)
}

// readAll replaces the cache with what etcd holds under the service's
// prefix now.
func (c *serviceCache) readAll(ctx context.Context) error {
	resp, err := c.r.readPrefix(ctx, "read service "+c.service, c.prefix)
	if err != nil {
		return err
	}
	c.r.stats.fullReads.Add(1)
	byID := make(map[string]kernel.Instance, len(resp.Kvs))
	mods := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		mods[string(kv.Key)] = kv.ModRevision
		in, err := decodeInstance(c.service, c.prefix, kv.Key, kv.Value)
		if err != nil {
			c.r.log.Warn("etcd: skipping a value that is not a kernrpc instance", "service", c.service, "err", err)
			continue
		}
		byID[in.ID] = in
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byID, c.mods, c.rev = byID, mods, resp.Header.Revision
	c.publishLocked()
	return nil
}

func (c *serviceCache) watched() (prefix string, what []any) {
	return c.prefix, []any{"service", c.service}
}

func (c *serviceCache) revision() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}

func (c *serviceCache) sameAs(kvs []*mvccpb.KeyValue) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return sameKeys(c.mods, kvs, func(k []byte) string { return string(k) })
}

// sameKeys reports whether kvs are the keys of mods, each at its ModRevision.
func sameKeys(mods map[string]int64, kvs []*mvccpb.KeyValue, key func([]byte) string) bool {
	if len(kvs) != len(mods) {
		return false
	}
	for _, kv := range kvs {
		if m, ok := mods[key(kv.Key)]; !ok || m != kv.ModRevision {
			return false
		}
	}
	return true
}

// follower is what follows the keys under one prefix through a watch: a
// service's cache (this file), a WatchShared (shared.go).
type follower interface {
	// watched is the prefix, and what to name it in logs.
	watched() (prefix string, what []any)
	// readAll reads every key under the prefix, as of a revision it
	// keeps, and makes the follower current with them.
	readAll(ctx context.Context) error
	// revision is the revision the follower is current at.
	revision() int64
	// apply brings the follower to the revision of resp.
	apply(resp clientv3.WatchResponse)
	// sameAs reports whether kvs (keys only) are the keys the follower
	// holds, each at the ModRevision it holds.
	sameAs(kvs []*mvccpb.KeyValue) bool
}

// readPrefix gets every key under prefix, for what (named in the error).
func (r *Registry) readPrefix(ctx context.Context, what, prefix string) (*clientv3.GetResponse, error) {
	var resp *clientv3.GetResponse
	err := r.request(ctx, what+" (keys "+prefix+"*)", func(ctx context.Context, cli *clientv3.Client) error {
		var err error
		resp, err = cli.Get(ctx, prefix, clientv3.WithPrefix())
		return err
	})
	return resp, err
}

// follow watches f's prefix from the revision after f's, applying every
// change, until ctx is done. When the watch breaks it resumes from the
// last revision applied; when that revision was compacted away, or etcd's
// history is another (a cluster wiped, or restored from an older backup),
// it reads the prefix whole, once, and watches on from there. gen is the
// count of reconnections to etcd (nextReconnect) before f's read.
func (r *Registry) follow(ctx context.Context, f follower, gen uint64) {
	cli, err := r.client()
	if err != nil {
		return // closed
	}
	prefix, what := f.watched()
	const firstWait = 100 * time.Millisecond
	wait := firstWait
	for ctx.Err() == nil {
		from := f.revision() + 1
		started := time.Now()
		var (
			reread string
			worked bool
		)
		reread, worked, gen, err = r.watchFrom(ctx, cli, f, prefix, from, gen)
		if ctx.Err() != nil {
			return
		}
		if worked || time.Since(started) >= time.Second {
			// The pause grows while watches fail in a row; one that
			// carried changes, or lasted longer than the longest pause,
			// did not fail, and the next resume pauses the least again.
			wait = firstWait
		}
		if reread != "" {
			r.log.Info("etcd: "+reread+"; reading the keys again", append(what, "revision", f.revision())...)
			for ctx.Err() == nil {
				_, now := r.nextReconnect()
				if err := f.readAll(ctx); err == nil {
					wait = firstWait
					gen = now
					break
				} else {
					r.log.Warn("etcd: reading the keys again failed; retrying", append(what, "err", err, "in", wait)...)
				}
				if !sleep(ctx, wait) {
					return
				}
				wait = min(2*wait, time.Second)
			}
			continue
		}
		r.stats.watchResumes.Add(1)
		r.log.Debug("etcd: watch ended; resuming from the last revision", append(what, "revision", from, "err", err)...)
		if !sleep(ctx, wait) {
			return
		}
		wait = min(2*wait, time.Second)
	}
}

// watchFrom runs one watch of prefix from revision from until it ends,
// applying its events to f. It reports why f must read the prefix whole
// again, if it must ("" if not): from was compacted away, or etcd's
// history is no longer the one f followed; whether it applied any
// response (it worked); and the count of reconnections f is known to be
// consistent with, gen when the watch began.
//
// etcd accepts a watch from a revision it has not reached, and waits for
// it; so does the etcd client, which resumes a broken watch by itself,
// from the revision after the last it received, without telling. A
// cluster wiped, or restored from an older backup, has another history:
// its revision starts again behind f's, and the watch would stay silent
// until the new history passed it, then go on from there, missing all
// that came before. So the watch checks that etcd still has f's history
// (sameHistory) each time the client connects to etcd again (see
// watchConnection); and when it is created, if the client reconnected
// since f was last checked or read (a reconnection the watch before did
// not see), or if its created response says etcd is behind from.
func (r *Registry) watchFrom(ctx context.Context, cli *clientv3.Client, f follower, prefix string, from int64, gen uint64) (reread string, worked bool, _ uint64, err error) {
	// WithRequireLeader: a member cut off from its cluster ends the watch
	// instead of leaving it silently stale; the next one finds a leader.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	reconnected, now := r.nextReconnect()
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithCreatedNotify())
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				return "", worked, gen, nil
			}
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				return "watch revision compacted", worked, gen, resp.Err()
			}
			if err := resp.Err(); err != nil {
				return "", worked, gen, err
			}
			if resp.Created {
				// Its header holds the revision of the member that
				// serves the watch: behind the one f holds when that
				// member lags behind the one f heard from last, or when
				// etcd's history is another.
				if now == gen && resp.Header.Revision >= from-1 {
					continue
				}
				if reread, err := r.sameHistory(ctx, f, prefix); reread != "" || err != nil {
					return reread, worked, gen, err
				}
				gen = now
				continue
			}
			f.apply(resp)
			worked = true
		case <-reconnected:
			reconnected, now = r.nextReconnect()
			if reread, err := r.sameHistory(ctx, f, prefix); reread != "" || err != nil {
				// A failed check ends the watch too: the next one is
				// checked when it is created.
				return reread, worked, gen, err
			}
			gen = now
		}
	}
}

// sameHistory checks that etcd holds the history f follows: that the keys
// under prefix at f's revision, as etcd has them now (one Get, keys only),
// are those f holds. They are not when etcd was wiped (the revision is in
// its future) or restored from an older backup (the revision may be past,
// but its keys are others). It returns why f must read the prefix again,
// or "" when it need not.
func (r *Registry) sameHistory(ctx context.Context, f follower, prefix string) (reread string, err error) {
	rev := f.revision()
	var resp *clientv3.GetResponse
	err = r.request(ctx, "check the history of keys "+prefix+"*", func(ctx context.Context, cli *clientv3.Client) error {
		var err error
		resp, err = cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(rev))
		return err
	})
	const other = "etcd's history is not the one the watch followed (etcd wiped, or restored from an older backup)"
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return "watch revision compacted", nil
	case errors.Is(err, rpctypes.ErrFutureRev):
		return other, nil
	case err != nil:
		return "", err
	case !f.sameAs(resp.Kvs):
		return other, nil
	}
	return "", nil
}

// apply brings the cache to the revision of resp and tells the
// subscribers, if anything changed.
func (c *serviceCache) apply(resp clientv3.WatchResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision <= c.rev {
			continue // already in a full read
		}
		id := string(ev.Kv.Key[len(c.prefix):])
		switch ev.Type {
		case mvccpb.DELETE:
			delete(c.mods, string(ev.Kv.Key))
			if _, ok := c.byID[id]; ok {
				delete(c.byID, id)
				changed = true
			}
		case mvccpb.PUT:
			c.mods[string(ev.Kv.Key)] = ev.Kv.ModRevision
			in, err := decodeInstance(c.service, c.prefix, ev.Kv.Key, ev.Kv.Value)
			if err != nil {
				c.r.log.Warn("etcd: skipping a value that is not a kernrpc instance", "service", c.service, "err", err)
				if _, ok := c.byID[id]; ok {
					delete(c.byID, id)
					changed = true
				}
				continue
			}
			c.byID[id] = in
			changed = true
		}
	}
	c.rev = max(c.rev, seenRevision(resp))
	if changed {
		c.publishLocked()
	}
}

// seenRevision is the revision resp brings its watcher to: that of its
// last event, not the revision in its header. A watcher catching up (one
// resumed after a disconnect) is sent the events of at most 1000
// revisions at a time, each batch under the revision etcd is at when it
// sends it: taking that one would skip every event of the batches after.
// A progress notification, which etcd sends only to a watcher that is
// caught up, brings it to its header's revision.
func seenRevision(resp clientv3.WatchResponse) int64 {
	if n := len(resp.Events); n > 0 {
		return resp.Events[n-1].Kv.ModRevision
	}
	if resp.IsProgressNotify() {
		return resp.Header.Revision
	}
	return 0
}

// publishLocked rebuilds the set from byID and sends it to every
// subscriber, replacing a set one has not read yet. It never blocks: the
// cache's goroutine and Watch are the only senders, and both hold c.mu.
func (c *serviceCache) publishLocked() {
	set := make([]kernel.Instance, 0, len(c.byID))
	for _, in := range c.byID {
		set = append(set, in)
	}
	slices.SortFunc(set, func(a, b kernel.Instance) int { return cmp.Compare(a.ID, b.ID) })
	c.set = set
	for s := range c.subs {
		select {
		case <-s.ch:
		default:
		}
		s.ch <- cloneSet(set)
	}
}

func (c *serviceCache) endLocked(s *subscriber) {
	if s.closed {
		return
	}
	s.closed = true
	delete(c.subs, s)
	close(s.ch)
}

// closeSubscribers closes every Watch channel, at the registry's Close.
func (c *serviceCache) closeSubscribers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for s := range c.subs {
		c.endLocked(s)
	}
}

// sleep waits d or until ctx is done, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
