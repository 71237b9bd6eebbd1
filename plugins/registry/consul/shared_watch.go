package consul

import (
	"context"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// sharedWatch follows the entries under one prefix for one WatchShared,
// on one goroutine, through a blocking query on a client of its own: its
// connections close when the watch ends, not when the registry does.
type sharedWatch struct {
	r      *Registry
	prefix string // the KV prefix: sharedPrefix + the caller's prefix
	fn     func(key string, value []byte)
	client *api.Client
	// live holds the entries last given to fn, by the caller's key.
	live map[string]sharedLive
	// skipped are keys whose values are no record, logged once each.
	skipped map[string]bool
	// stale are the entries the last listing found expired, by key, with
	// their ModifyIndex: expire deletes them.
	stale map[string]uint64
}

type sharedLive struct {
	index   uint64 // the entry's ModifyIndex
	expires time.Time
}

// WatchShared calls fn with every live entry under prefix, then with every
// change (nil for a removed or expired entry) until ctx is done or the
// registry is closed. It returns once the current entries have been given,
// or with the first listing's error.
func (r *Registry) WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error {
	if _, err := r.sharedUsable(ctx, "watch shared "+prefix); err != nil {
		return err
	}
	client, tr, err := newClient(r.cfg)
	if err != nil {
		return err
	}
	w := &sharedWatch{r: r, prefix: sharedPrefix + prefix, fn: fn, client: client,
		live: map[string]sharedLive{}, skipped: map[string]bool{}, stale: map[string]uint64{}}
	octx, cancel := r.opContext(ctx)
	pairs, meta, err := client.KV().List(w.prefix, (&api.QueryOptions{}).WithContext(octx))
	cancel()
	if err != nil {
		tr.CloseIdleConnections()
		return r.fail("watch shared "+prefix, err)
	}
	w.apply(pairs, false)
	wctx, stop := context.WithCancel(ctx)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		stop()
		tr.CloseIdleConnections()
		return nil // Close came meanwhile: nothing more will be given
	}
	stopOnClose := context.AfterFunc(r.life, stop)
	r.goBackground(func() {
		defer stopOnClose()
		defer stop()
		defer tr.CloseIdleConnections()
		w.follow(wctx, meta.LastIndex)
	})
	r.mu.Unlock()
	return nil
}

// follow is the watch's blocking query loop. A query waits at most until
// the next live entry expires, so that its expiry is given on time. After
// a failed query, the next answer gives fn every entry again.
func (w *sharedWatch) follow(ctx context.Context, index uint64) {
	r := w.r
	failures := 0
	for ctx.Err() == nil {
		wait := r.cfg.waitTime
		if next, ok := w.nextExpiry(); ok {
			wait = min(wait, max(time.Until(next), 10*time.Millisecond))
		}
		qctx, cancel := context.WithTimeout(ctx, wait+wait/16+r.cfg.timeout)
		pairs, meta, err := w.client.KV().List(w.prefix, (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(qctx))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			if failures == 1 {
				r.log.Warn("consul: shared entries' blocking query failed; trying again", "prefix", w.prefix, "err", err)
			}
			w.expire(time.Now()) // on time, agent or not; deleting waits for it
			if !sleep(ctx, backoff(failures)) {
				return
			}
			continue
		}
		switch {
		case meta.LastIndex < index:
			index = 0 // a restored snapshot or a new agent: list again without blocking
		case meta.LastIndex == 0:
			index = 1
		default:
			index = meta.LastIndex
		}
		w.apply(pairs, failures > 0)
		failures = 0
		w.expire(time.Now())
		w.deleteStale(ctx)
	}
}

// apply gives fn what changed since the last listing: every live entry
// new or written again (every live entry, after a failure), and nil for
// each that went.
func (w *sharedWatch) apply(pairs api.KVPairs, again bool) {
	now := time.Now()
	seen := make(map[string]bool, len(pairs))
	for _, p := range pairs {
		key := strings.TrimPrefix(p.Key, sharedPrefix)
		rec, err := decodeShared(p.Value)
		if err != nil {
			if !w.skipped[key] {
				w.skipped[key] = true
				w.r.log.Warn("consul: leaving out a shared entry kernrpc did not write", "key", p.Key, "why", err)
			}
			continue
		}
		if !rec.expires().After(now) {
			w.stale[key] = p.ModifyIndex
			continue // expired: given as nil below if it was live
		}
		seen[key] = true
		old, was := w.live[key]
		w.live[key] = sharedLive{index: p.ModifyIndex, expires: rec.expires()}
		if again || !was || old.index != p.ModifyIndex {
			w.fn(key, rec.Value)
		}
	}
	for key := range w.live {
		if !seen[key] {
			delete(w.live, key)
			w.fn(key, nil)
		}
	}
}

// expire gives nil for every live entry past its time, and leaves it to
// deleteStale.
func (w *sharedWatch) expire(now time.Time) {
	for key, l := range w.live {
		if l.expires.After(now) {
			continue
		}
		delete(w.live, key)
		w.fn(key, nil)
		w.stale[key] = l.index
	}
}

// deleteStale deletes the expired entries from Consul, each unless it was
// written since.
func (w *sharedWatch) deleteStale(ctx context.Context) {
	for key, index := range w.stale {
		delete(w.stale, key)
		octx, cancel := w.r.opContext(ctx)
		// A failure leaves the entry to the next watcher that sees it expire.
		_, _, _ = w.client.KV().DeleteCAS(&api.KVPair{Key: sharedPrefix + key, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(octx))
		cancel()
	}
}

// nextExpiry is the time the first live entry expires, if any is live.
func (w *sharedWatch) nextExpiry() (time.Time, bool) {
	var next time.Time
	for _, l := range w.live {
		if next.IsZero() || l.expires.Before(next) {
			next = l.expires
		}
	}
	return next, !next.IsZero()
}
