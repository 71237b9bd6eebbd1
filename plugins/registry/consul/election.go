package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// electionPrefix is the KV prefix of election keys: the leader of election
// E holds the lock on kernrpc/elections/E, whose value is its id.
const electionPrefix = "kernrpc/elections/"

// lockDelay is the lock-delay of election sessions. Consul blocks a lock
// for lock-delay after the session holding it was invalidated (15s when
// not given, and the client cannot send 0), to shield against a leader
// that has not noticed yet. Here a leader gives up on its own before its
// session can expire (see renew), so the shield is not needed, and a
// longer delay would push failover past session_ttl.
const lockDelay = time.Millisecond

// leadership is a won Campaign: a session kept alive by renew and a lock
// on the election's key, watched by monitor.
type leadership struct {
	r       *Registry
	key     string
	session string
	lost    chan struct{}
	stop    context.CancelFunc // ends renew and monitor
	done    sync.WaitGroup
	once    sync.Once // closes lost

	resignOnce sync.Once
	resignErr  error
}

// Campaign creates a session with session_ttl and tries to acquire the
// lock on the election's key; while another holds it, it waits for the key
// to be released (a blocking query) and tries again. It returns once id
// leads, or when ctx is done (its session destroyed then), or with an
// error wrapping kernel.ErrClosed when the registry closes first.
func (r *Registry) Campaign(ctx context.Context, election, id string) (kernel.Leadership, error) {
	op := fmt.Sprintf("campaign %q as %q", election, id)
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("consul: %s: %w", op, ctx.Err())
	case election == "" || strings.HasPrefix(election, "/"):
		return nil, fmt.Errorf("consul: %s: the election name must be non-empty and not start with '/'", op)
	case id == "":
		return nil, fmt.Errorf("consul: %s: empty id", op)
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("consul: %s: %w", op, kernel.ErrClosed)
	}
	// The campaign ends with ctx or with the registry; ended says which.
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(r.life, cancel)()
	defer cancel()
	ended := func() error {
		if caller.Err() == nil && r.life.Err() != nil {
			return fmt.Errorf("consul: %s: %w", op, kernel.ErrClosed)
		}
		return fmt.Errorf("consul: %s: %w", op, ctx.Err())
	}

	// Consul invalidates an unrenewed session only at twice its TTL, so it
	// is asked for half of session_ttl: a dead leader's session then ends
	// within session_ttl.
	sctx, scancel := r.opContext(ctx)
	created := time.Now() // Consul's TTL of the session starts no earlier
	session, _, err := r.client.Session().CreateNoChecks(&api.SessionEntry{
		Name: "kernrpc election " + election, TTL: (r.cfg.sessionTTL / 2).String(),
		Behavior: api.SessionBehaviorRelease, LockDelay: lockDelay,
	}, (&api.WriteOptions{}).WithContext(sctx))
	scancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ended()
		}
		return nil, fmt.Errorf("%w (option \"session_ttl\" is %s, and Consul is asked for half of it, which must lie within the agent's session_ttl_min, 10s by default, and 24h)", r.fail(op+": create session", err), r.cfg.sessionTTL)
	}
	l := &leadership{r: r, key: electionPrefix + election, session: session, lost: make(chan struct{})}
	life, stop := context.WithCancel(r.heartbeat)
	l.stop = stop
	l.done.Go(func() { l.renew(life, created) })

	if err := l.acquire(ctx, id); err != nil {
		dctx, dcancel := context.WithTimeout(context.Background(), r.cfg.timeout)
		l.resign(dctx)
		dcancel()
		if ctx.Err() != nil {
			return nil, ended()
		}
		return nil, r.fail(op, err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		l.resign(context.Background())
		return nil, fmt.Errorf("consul: %s: %w", op, kernel.ErrClosed)
	}
	r.leaderships[l] = struct{}{}
	r.mu.Unlock()
	l.done.Go(func() { l.monitor(life) })
	return l, nil
}

// acquire loops until the lock is held, ctx is done, or the session is
// lost.
func (l *leadership) acquire(ctx context.Context, id string) error {
	r := l.r
	var index uint64
	var failures int
	// delayed counts the acquires in a row refused while the key had no
	// holder: a lock-delay is running, which no blocking query can wait
	// out, as the key does not change when it ends.
	var delayed int
	for {
		select {
		case <-l.lost:
			return errors.New("the election session ended before the lock was won")
		default:
		}
		actx, cancel := r.opContext(ctx)
		ok, _, err := r.client.KV().Acquire(&api.KVPair{Key: l.key, Value: []byte(id), Session: l.session}, (&api.WriteOptions{}).WithContext(actx))
		cancel()
		if err == nil && ok {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failures++
			if failures > 3 {
				return err
			}
			if !sleep(ctx, backoff(failures)) {
				return ctx.Err()
			}
			continue
		}
		// Held by another session (or within a lock-delay): wait for a
		// change of the key, then try again.
		qctx, qcancel := context.WithTimeout(ctx, r.cfg.waitTime+r.cfg.waitTime/16+r.cfg.timeout)
		pair, meta, err := r.client.KV().Get(l.key, (&api.QueryOptions{WaitIndex: index, WaitTime: r.cfg.waitTime}).WithContext(qctx))
		qcancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failures++
			if failures > 3 {
				return err
			}
			sleep(ctx, backoff(failures))
			continue
		}
		failures = 0
		if meta.LastIndex < index {
			index = 0
		} else {
			index = max(meta.LastIndex, 1)
		}
		if pair == nil || pair.Session == "" {
			// Free: a short pause covers the lock-delay of a session of
			// ours that was invalidated. A session of another client may
			// have set a longer one (Consul's default is 15s): the pause
			// then doubles, up to a second, so that the wait costs a few
			// requests instead of two every 10ms.
			sleep(ctx, min(10*lockDelay<<min(delayed, 10), time.Second))
			delayed++
			index = 0
		} else {
			delayed = 0
		}
	}
}

// renew keeps the session alive every session_ttl/4 (half its Consul TTL,
// as the Consul client's RenewPeriodic does). The leader gives up (Lost
// closes) when the agent says the session is gone, or when no renewal
// succeeded for 2/3 of session_ttl: Consul invalidates the session
// session_ttl after its last renewal, and a leader must stop before another
// can take over. The 2/3 count from when the last successful renewal was
// sent (Consul renews no earlier), and no renewal request or pause outlasts
// them, however long the timeout option: a request that hangs (a network
// partition) must not keep the leader past the point it gives up. Once
// renewals stop for good (Resign, Close, AbandonLeases), the leadership
// ends too: a session nobody renews is lost.
func (l *leadership) renew(ctx context.Context, created time.Time) {
	defer l.end()
	r := l.r
	ttl := r.cfg.sessionTTL
	last := created
	for {
		deadline := last.Add(ttl * 2 / 3)
		if !sleep(ctx, min(ttl/4, time.Until(deadline))) {
			return
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			r.log.Warn("consul: election session not renewed in 2/3 of its TTL; leadership given up", "key", l.key)
			return
		}
		rctx, cancel := context.WithTimeout(ctx, min(r.cfg.timeout, deadline.Sub(sent)))
		entry, _, err := r.client.Session().Renew(l.session, (&api.WriteOptions{}).WithContext(rctx))
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && entry == nil:
			r.log.Warn("consul: election session is gone; leadership lost", "key", l.key)
			return
		case err == nil:
			last = sent
		case !time.Now().Before(deadline):
			r.log.Warn("consul: election session not renewed in 2/3 of its TTL; leadership given up", "key", l.key, "err", err)
			return
		}
	}
}

// monitor watches the key with blocking queries and ends the leadership
// when the lock is no longer this session's.
func (l *leadership) monitor(ctx context.Context) {
	r := l.r
	var index uint64
	var failures int
	for ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.waitTime+r.cfg.waitTime/16+r.cfg.timeout)
		pair, meta, err := r.client.KV().Get(l.key, (&api.QueryOptions{WaitIndex: index, WaitTime: r.cfg.waitTime}).WithContext(qctx))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			sleep(ctx, backoff(failures))
			continue // renew decides when an unreachable agent means loss
		}
		failures = 0
		if pair == nil || pair.Session != l.session {
			l.end()
			return
		}
		if meta.LastIndex < index {
			index = 0
		} else {
			index = max(meta.LastIndex, 1)
		}
	}
}

// end closes lost, and stops renew and monitor: a leadership that is over
// neither keeps its session alive nor queries its key, whether or not
// Resign is called on it (the session, now holding nothing, expires).
func (l *leadership) end() {
	l.once.Do(func() {
		close(l.lost)
		l.stop()
	})
}

// Lost is closed when the leadership ends: resigned, the session lost or
// no longer renewed (AbandonLeases), the lock taken away, or the registry
// closed.
func (l *leadership) Lost() <-chan struct{} { return l.lost }

// Resign releases the lock and destroys the session. It is idempotent.
func (l *leadership) Resign(ctx context.Context) error {
	r := l.r
	r.mu.Lock()
	delete(r.leaderships, l)
	r.mu.Unlock()
	if err := l.resign(ctx); err != nil {
		return r.fail("resign "+l.key, err)
	}
	return nil
}

// resign stops renew and monitor, releases the lock and destroys the
// session (whose destruction alone would release the lock too), once.
func (l *leadership) resign(ctx context.Context) error {
	l.resignOnce.Do(func() {
		l.stop()
		l.done.Wait()
		l.end()
		r := l.r
		cctx, cancel := context.WithTimeout(ctx, r.cfg.timeout)
		defer cancel()
		_, _, rerr := r.client.KV().Release(&api.KVPair{Key: l.key, Session: l.session}, (&api.WriteOptions{}).WithContext(cctx))
		_, derr := r.client.Session().Destroy(l.session, (&api.WriteOptions{}).WithContext(cctx))
		l.resignErr = errors.Join(rerr, derr)
	})
	return l.resignErr
}
