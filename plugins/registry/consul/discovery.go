package consul

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// serviceCache is the local view of one service's passing instances, kept
// current by one blocking query loop, shared by Resolve and every watcher.
type serviceCache struct {
	r       *Registry
	service string

	attempted chan struct{} // closed once the first query ended, either way

	mu       sync.Mutex
	have     bool // set holds an answer from Consul
	set      []kernel.Instance
	lastErr  error // of the last failed query, until one succeeds
	closed   bool
	watchers map[*watcher]func() bool // each with the stop of its context.AfterFunc
	// skipped are the entries of the last answer that were no instance,
	// by Consul service ID, with why: each is logged when it first shows.
	// Only update, on the cache's one loop, touches it.
	skipped map[string]string
}

type watcher struct {
	ch chan []kernel.Instance
}

// cache returns the cache of service, starting its loop the first time.
func (r *Registry) cache(service string) (*serviceCache, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, kernel.ErrClosed
	}
	c := r.caches[service]
	if c == nil {
		c = &serviceCache{r: r, service: service, attempted: make(chan struct{}), watchers: make(map[*watcher]func() bool)}
		r.caches[service] = c
		r.goBackground(c.follow)
	}
	return c, nil
}

// ready waits, bounded by ctx and the timeout option, until the cache has
// an answer, and returns the error of Consul's last failure otherwise.
func (c *serviceCache) ready(ctx context.Context, op string) error {
	c.mu.Lock()
	have := c.have
	c.mu.Unlock()
	if have {
		return nil
	}
	t := time.NewTimer(c.r.cfg.timeout + c.r.cfg.timeout/2)
	defer t.Stop()
	select {
	case <-c.attempted:
	case <-ctx.Done():
		return fmt.Errorf("consul: %s %s: waiting for the first answer of agent %s: %w", op, c.service, c.r.cfg.address, ctx.Err())
	case <-t.C:
		return fmt.Errorf("consul: %s %s: agent %s gave no answer within option \"timeout\" (%s)", op, c.service, c.r.cfg.address, c.r.cfg.timeout)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.have:
		return nil
	case c.closed || c.r.life.Err() != nil:
		return fmt.Errorf("consul: %s %s: %w", op, c.service, kernel.ErrClosed)
	default:
		return fmt.Errorf("%w (the registry keeps trying, with backoff)", c.r.fail(op+" "+c.service, c.lastErr))
	}
}

// Resolve returns service's instances whose checks all pass, sorted by ID.
// Only the first Resolve or Watch of a service waits for Consul; later ones
// read the local cache, which a blocking query keeps current. When Consul
// becomes unreachable later, the cache keeps its last answer.
func (r *Registry) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("consul: resolve %s: %w", service, err)
	}
	if err := checkService(service); err != nil {
		return nil, fmt.Errorf("consul: resolve: %w", err)
	}
	c, err := r.cache(service)
	if err != nil {
		return nil, fmt.Errorf("consul: resolve %s: %w", service, err)
	}
	if err := c.ready(ctx, "resolve"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneSet(c.set), nil
}

// Watch sends service's instances (as Resolve lists them) now and after
// every change Consul reports. A slow receiver gets only the latest set.
// The channel is closed when ctx is done or the registry is closed. Like
// Resolve, the first Watch of a service waits for Consul's first answer,
// and fails when there is none within the timeout option.
func (r *Registry) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("consul: watch %s: %w", service, err)
	}
	if err := checkService(service); err != nil {
		return nil, fmt.Errorf("consul: watch: %w", err)
	}
	c, err := r.cache(service)
	if err != nil {
		return nil, fmt.Errorf("consul: watch %s: %w", service, err)
	}
	if err := c.ready(ctx, "watch"); err != nil {
		return nil, err
	}
	w := &watcher{ch: make(chan []kernel.Instance, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("consul: watch %s: %w", service, kernel.ErrClosed)
	}
	w.ch <- cloneSet(c.set)
	c.watchers[w] = context.AfterFunc(ctx, func() { c.endWatch(w) })
	return w.ch, nil
}

func (c *serviceCache) endWatch(w *watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.watchers[w]; ok {
		delete(c.watchers, w)
		close(w.ch)
	}
}

// closeWatchers closes every watch channel; the registry is closing.
func (c *serviceCache) closeWatchers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for w, stop := range c.watchers {
		stop()
		close(w.ch)
	}
	clear(c.watchers)
}

// follow is the blocking query loop: it asks for changes after the last
// index Consul gave, waiting up to wait_time each time, until Close.
func (c *serviceCache) follow() {
	r := c.r
	var index uint64
	var failures int
	first := true
	defer func() {
		if first {
			// Closed before the first query ended: a Resolve or Watch
			// waiting for it has nothing more to wait for.
			close(c.attempted)
		}
	}()
	for r.life.Err() == nil {
		// Consul may hold a query wait_time plus wait_time/16 of jitter.
		ctx, cancel := context.WithTimeout(r.life, r.cfg.waitTime+r.cfg.waitTime/16+r.cfg.timeout)
		if first {
			ctx, cancel = context.WithTimeout(r.life, r.cfg.timeout)
		}
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: r.cfg.waitTime}).WithContext(ctx)
		entries, meta, err := r.client.Health().Service(c.service, "", true, q)
		cancel()
		if r.life.Err() != nil {
			return
		}
		if err != nil {
			c.failed(err, first)
			first = false
			failures++
			if !sleep(r.life, backoff(failures)) {
				return
			}
			continue
		}
		failures = 0
		switch {
		case meta.LastIndex < index:
			// The index went backwards (a restored snapshot, a new agent):
			// start over without blocking, or changes could be missed.
			index = 0
		case meta.LastIndex == 0:
			index = 1 // never block on 0, which does not block at all
		default:
			index = meta.LastIndex
		}
		c.update(entries, first)
		first = false
	}
}

// backoff is the pause after the nth failure in a row: 100ms doubling up
// to 5s, with jitter so that many caches do not retry at once.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n-1, 6)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}

func (c *serviceCache) failed(err error, first bool) {
	c.mu.Lock()
	c.lastErr = err
	have := c.have
	c.mu.Unlock()
	if first {
		close(c.attempted)
	}
	if have {
		c.r.log.Warn("consul: blocking query failed; serving the last set and trying again", "service", c.service, "err", err)
	}
}

// update stores a new answer and sends it to the watchers when it differs
// from the last.
func (c *serviceCache) update(entries []*api.ServiceEntry, first bool) {
	set := make([]kernel.Instance, 0, len(entries))
	var skipped map[string]string
	for _, e := range entries {
		if e.Service != nil && e.Service.Service != c.service {
			// Consul looks a service up whatever the case of its name
			// (hashicorp/consul#5707): this entry is of "Echo" where
			// c.service is "echo". kernrpc's service names are exact, and
			// a client of one must not dial the servers of the other.
			continue
		}
		in, err := decodeEntry(c.service, e)
		if err == nil {
			set = append(set, in)
			continue
		}
		if skipped == nil {
			skipped = map[string]string{}
		}
		id := ""
		if e.Service != nil {
			id = e.Service.ID
		}
		skipped[id] = err.Error()
		if c.skipped[id] != skipped[id] { // once, not at every answer
			c.r.log.Warn("consul: leaving out an entry no client could dial", "service", c.service, "consul_id", id, "why", err)
		}
	}
	c.skipped = skipped
	slices.SortFunc(set, func(a, b kernel.Instance) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	c.mu.Lock()
	changed := !c.have || !sameSet(c.set, set)
	c.have, c.lastErr = true, nil
	if changed {
		c.set = set
		for w := range c.watchers {
			select { // a slow receiver keeps only the latest set
			case <-w.ch:
			default:
			}
			w.ch <- cloneSet(set)
		}
	}
	c.mu.Unlock()
	if first {
		close(c.attempted)
	}
}

func sameSet(a, b []kernel.Instance) bool {
	return slices.EqualFunc(a, b, func(x, y kernel.Instance) bool {
		return x.ID == y.ID && x.Address == y.Address && x.Load == y.Load && maps.Equal(x.Metadata, y.Metadata)
	})
}

// cloneSet copies a set for a caller, who may keep or change it.
func cloneSet(set []kernel.Instance) []kernel.Instance {
	out := make([]kernel.Instance, len(set))
	for i, in := range set {
		in.Metadata = maps.Clone(in.Metadata)
		out[i] = in
	}
	return out
}
