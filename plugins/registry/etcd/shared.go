package etcd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kernrpc/kernrpc/kernel"
)

// sharedReuse is how long after its grant a shared entries' lease takes
// more entries. A lease of ttl seconds is granted for ttl+1: an entry put
// on it within the first second expires between ttl and ttl+1s after the
// put, and a burst of puts (every breaker of a dead host opening) costs
// one grant a second, not one per put.
const sharedReuse = time.Second

// sharedLeases are the leases of the shared entries this registry put.
// They are never kept alive: an entry goes ttl after its last put, or
// when Close revokes its lease, or when the process dies.
type sharedLeases struct {
	mu      sync.Mutex
	current map[int64]sharedLease          // by ttl in seconds: the lease puts of that ttl take now
	live    map[clientv3.LeaseID]time.Time // every lease granted, until it expires: Close revokes them
}

type sharedLease struct {
	id      clientv3.LeaseID
	granted time.Time
}

// sharedKey is key's etcd key.
func (r *Registry) sharedKey(key string) string { return r.opts.SharedPrefix + key }

// PutShared writes key under a lease of ttl (the ttl option when 0),
// rounded up to whole seconds, plus up to a second: see sharedReuse.
func (r *Registry) PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	what := "put shared " + key
	if err := r.usable(ctx, what); err != nil {
		return err
	}
	switch {
	case key == "":
		return fmt.Errorf("%s: put shared: empty key", Name)
	case ttl < 0:
		return fmt.Errorf("%s: %s: negative ttl %s", Name, what, ttl)
	case r.isAbandoned():
		return fmt.Errorf("%s: %w", what, errAbandoned)
	}
	seconds := r.ttlSeconds(ttl)
	for retried := false; ; retried = true {
		id, err := r.sharedLease(ctx, what, seconds)
		if err != nil {
			return err
		}
		err = r.request(ctx, what, func(ctx context.Context, cli *clientv3.Client) error {
			_, err := cli.Put(ctx, r.sharedKey(key), string(value), clientv3.WithLease(id))
			return err
		})
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && !retried {
			// Gone before its time (etcd lost it): grant another.
			r.forgetSharedLease(seconds, id)
			continue
		}
		if err == nil {
			r.stats.sharedWrites.Add(1)
		}
		return err
	}
}

// sharedLease returns the lease a put of ttl seconds goes under now,
// granting one if the current one is older than sharedReuse.
func (r *Registry) sharedLease(ctx context.Context, what string, ttl int64) (clientv3.LeaseID, error) {
	l := &r.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if cur, ok := l.current[ttl]; ok && now.Sub(cur.granted) < sharedReuse {
		return cur.id, nil
	}
	var id clientv3.LeaseID
	err := r.request(ctx, what+": grant lease", func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Grant(ctx, ttl+1)
		if err == nil {
			id = resp.ID
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	r.stats.sharedLeaseGrants.Add(1)
	if l.current == nil {
		l.current, l.live = make(map[int64]sharedLease), make(map[clientv3.LeaseID]time.Time)
	}
	for old, expires := range l.live {
		if now.After(expires) {
			delete(l.live, old)
		}
	}
	l.current[ttl] = sharedLease{id: id, granted: now}
	l.live[id] = now.Add(time.Duration(ttl+1) * time.Second)
	return id, nil
}

func (r *Registry) forgetSharedLease(ttl int64, id clientv3.LeaseID) {
	l := &r.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current[ttl].id == id {
		delete(l.current, ttl)
	}
	delete(l.live, id)
}

// revokeShared revokes the leases of the shared entries this registry
// put, at Close: its entries go at once. A lease that expired already is
// not an error.
func (r *Registry) revokeShared() error {
	l := &r.shared
	l.mu.Lock()
	live := l.live
	l.current, l.live = nil, nil
	l.mu.Unlock()
	var errs []error
	now := time.Now()
	for id, expires := range live {
		if now.After(expires) {
			continue
		}
		err := r.request(r.ctx, "close: revoke shared entries' lease", func(ctx context.Context, cli *clientv3.Client) error {
			_, err := cli.Revoke(ctx, id)
			return err
		})
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeleteShared deletes key, whoever put it.
func (r *Registry) DeleteShared(ctx context.Context, key string) error {
	what := "delete shared " + key
	if err := r.usable(ctx, what); err != nil {
		return err
	}
	return r.request(ctx, what, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Delete(ctx, r.sharedKey(key))
		return err
	})
}

// WatchShared reads every entry under prefix and gives them to fn before
// it returns, then watches the prefix from the revision after that read
// (resuming after a broken watch, reading whole again after compaction,
// as a service's watch does) until ctx is done or the registry closes. A
// read after compaction gives fn every entry again, and nil for the ones
// that went meanwhile. fn must not close the registry.
func (r *Registry) WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error {
	what := "watch shared " + prefix
	if err := r.usable(ctx, what); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.ctx, cancel) // the registry's Close ends the watch
	w := &sharedWatch{r: r, prefix: r.sharedKey(prefix), fn: fn, known: make(map[string]int64)}
	_, gen := r.nextReconnect()
	if err := w.readAll(wctx); err != nil {
		stop()
		cancel()
		return err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		stop()
		cancel()
		return fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
	}
	r.caches.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.caches.Done()
		defer stop()
		defer cancel()
		r.follow(wctx, w, gen)
	}()
	return nil
}

// sharedWatch is one WatchShared: a follower (discovery.go) that hands
// every change to fn. Only one goroutine at a time uses it: the caller
// of WatchShared for the first read, then the watch's goroutine.
type sharedWatch struct {
	r      *Registry
	prefix string // the etcd prefix: <shared_prefix><prefix>
	fn     func(key string, value []byte)
	rev    int64
	known  map[string]int64 // keys given to fn and not removed since, with their ModRevision
}

func (w *sharedWatch) watched() (string, []any) { return w.prefix, []any{"shared_prefix", w.prefix} }

func (w *sharedWatch) revision() int64 { return w.rev }

func (w *sharedWatch) sameAs(kvs []*mvccpb.KeyValue) bool { return sameKeys(w.known, kvs, w.key) }

// readAll gives fn every entry under the prefix, in key order, and nil
// for the keys it was given before that are gone.
func (w *sharedWatch) readAll(ctx context.Context) error {
	resp, err := w.r.readPrefix(ctx, "read shared entries", w.prefix)
	if err != nil {
		return err
	}
	now := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		k := w.key(kv.Key)
		now[k] = kv.ModRevision
		w.fn(k, entryValue(kv.Value))
	}
	gone := make([]string, 0)
	for k := range w.known {
		if _, ok := now[k]; !ok {
			gone = append(gone, k)
		}
	}
	sort.Strings(gone)
	for _, k := range gone {
		w.fn(k, nil)
	}
	w.known, w.rev = now, resp.Header.Revision
	return nil
}

func (w *sharedWatch) apply(resp clientv3.WatchResponse) {
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision <= w.rev {
			continue // already in a full read
		}
		k := w.key(ev.Kv.Key)
		switch ev.Type {
		case mvccpb.DELETE:
			delete(w.known, k)
			w.fn(k, nil)
		case mvccpb.PUT:
			w.known[k] = ev.Kv.ModRevision
			w.fn(k, entryValue(ev.Kv.Value))
		}
	}
	w.rev = max(w.rev, seenRevision(resp))
}

// entryValue is fn's copy of a value: never nil, which would say removed,
// even for an empty one.
func entryValue(v []byte) []byte { return append([]byte{}, v...) }

// key is an etcd key's shared key: without the shared prefix.
func (w *sharedWatch) key(etcdKey []byte) string {
	return strings.TrimPrefix(string(etcdKey), w.r.opts.SharedPrefix)
}
