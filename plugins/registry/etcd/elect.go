package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kernrpc/kernrpc/kernel"
)

// Campaign blocks until id leads election or ctx is done. Each campaign
// runs on a session of its own (a lease of the ttl option, renewed by
// keep) under electionKey; the candidates queue by creation revision, as
// concurrency.Election's do. A candidate whose session is lost while it
// waits (etcd unreachable for the ttl, wiped, or restored from a backup)
// campaigns again on a new one, and a candidate rereads the line each time
// the connection to etcd comes back, since a watch resumed from a revision
// the cluster no longer has would wait forever. The Leadership's Lost
// closes when it is resigned (before the next candidate can win), when the
// session is lost (this registry closed, AbandonLeases, etcd gone for 2/3
// of the ttl: before etcd can expire the lease and elect another), or when
// the leader's key is found gone after a reconnection.
func (r *Registry) Campaign(ctx context.Context, election, id string) (kernel.Leadership, error) {
	what := fmt.Sprintf("campaign %q for %q", election, id)
	if err := r.usable(ctx, what); err != nil {
		return nil, err
	}
	if election == "" {
		return nil, fmt.Errorf("%s: %s: empty election name", Name, what)
	}
	for again := false; ; again = true {
		if r.isAbandoned() {
			return nil, fmt.Errorf("%s: %w", what, errAbandoned)
		}
		sess, err := r.newSession(ctx, what)
		if err != nil {
			if !again || ctx.Err() != nil || r.usable(ctx, what) != nil || r.isAbandoned() {
				return nil, err
			}
			// In line already, the campaign waits out an outage (a wipe,
			// a restart) as a watch does.
			r.log.Warn("etcd: cannot campaign again yet", "election", election, "id", id, "err", err)
			if !sleep(ctx, 500*time.Millisecond) {
				return nil, fmt.Errorf("%s: %s: %w", Name, what, context.Cause(ctx))
			}
			continue
		}
		l, err := r.campaign(ctx, sess, election, id, what)
		if err == nil {
			return l, nil
		}
		r.dropSession(sess)
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%s: %s: %w", Name, what, context.Cause(ctx))
		case errors.Is(err, errSessionLost):
			r.log.Warn("etcd: election session lost while campaigning; campaigning again", "election", election, "id", id)
			continue
		}
		return nil, err
	}
}

// errSessionLost ends a campaign whose session's lease was lost (or whose
// key went) while it waited in line.
var errSessionLost = errors.New("the session's lease was lost while campaigning")

// campaign puts sess's candidate key and waits until no key of the
// election was created before it.
func (r *Registry) campaign(ctx context.Context, sess *session, election, id, what string) (*leadership, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the campaign ends with its session
		select {
		case <-sess.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	lost := func(err error) error {
		if sess.isDone() {
			return fmt.Errorf("%s: %s: %w", Name, what, errSessionLost)
		}
		return err
	}
	prefix := r.electionKey(election)
	key := fmt.Sprintf("%s%x", prefix, sess.lease)
	var rev int64
	err := r.request(ctx, what+": put candidate", func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Put(ctx, key, id, clientv3.WithLease(sess.lease))
		if err == nil {
			rev = resp.Header.Revision // the key is new: named by a new lease
		}
		return err
	})
	if err != nil {
		return nil, lost(err)
	}
	for {
		reconnected, _ := r.nextReconnect()
		won, err := r.waitInLine(ctx, prefix, key, rev, what, reconnected)
		if err != nil {
			return nil, lost(err)
		}
		if won {
			break
		}
		// Reconnected: etcd may have been wiped or restored meanwhile, and
		// the line is read again.
	}
	if sess.isDone() {
		return nil, fmt.Errorf("%s: %s: %w", Name, what, errSessionLost)
	}
	l := &leadership{r: r, sess: sess, key: key, rev: rev, lost: make(chan struct{}), resigned: make(chan struct{})}
	go l.watch()
	return l, nil
}

// waitInLine waits until every key of the election created before rev is
// deleted (won), or until reconnected closes (not won: read the line
// again). It fails with errSessionLost if key is no longer the one put at
// rev.
func (r *Registry) waitInLine(ctx context.Context, prefix, key string, rev int64, what string, reconnected <-chan struct{}) (won bool, err error) {
	cli, err := r.client()
	if err != nil {
		return false, fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	for {
		var resp *clientv3.TxnResponse
		err := r.request(ctx, what+": read the line", func(ctx context.Context, cli *clientv3.Client) error {
			var err error
			resp, err = cli.Txn(ctx).Then(
				clientv3.OpGet(key),
				clientv3.OpGet(prefix, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...),
			).Commit()
			return err
		})
		if err != nil {
			return false, err
		}
		own, before := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != rev {
			return false, fmt.Errorf("%s: %s: %w", Name, what, errSessionLost)
		}
		if len(before) == 0 {
			return true, nil
		}
		deleted, err := waitDelete(ctx, cli, string(before[0].Key), resp.Header.Revision, reconnected)
		if err != nil {
			return false, fmt.Errorf("%s: %s: wait for %s: %w", Name, what, before[0].Key, err)
		}
		if !deleted {
			return false, nil
		}
	}
}

// waitDelete watches key from rev until it is deleted (true), or until
// reconnected closes (false).
func waitDelete(ctx context.Context, cli *clientv3.Client, key string, rev int64, reconnected <-chan struct{}) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(ctx, key, clientv3.WithRev(rev))
	for {
		select {
		case <-reconnected:
			return false, nil
		case wr, ok := <-wch:
			if !ok {
				if err := ctx.Err(); err != nil {
					return false, err
				}
				return false, nil // read the line again
			}
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
					return false, nil
				}
				return false, err
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return true, nil
				}
			}
		}
	}
}

// session is the lease of one campaign and of the leadership it wins.
type session struct {
	lease clientv3.LeaseID
	ttl   time.Duration
	stop  context.CancelFunc // ends keep: no more renewals
	done  chan struct{}      // closed when keep returns
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// newSession grants a lease within dial_timeout and keeps it alive until
// the registry closes or the session is dropped.
func (r *Registry) newSession(ctx context.Context, what string) (*session, error) {
	ttl := r.ttlSeconds(0)
	var lease clientv3.LeaseID
	granted := time.Now() // etcd's TTL of the lease starts no earlier
	err := r.request(ctx, what+": grant session lease", func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Grant(ctx, ttl)
		if err == nil {
			lease = resp.ID
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	cli, err := r.client()
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	kctx, stop := context.WithCancel(r.ctx)
	s := &session{lease: lease, ttl: time.Duration(ttl) * time.Second, stop: stop, done: make(chan struct{})}
	r.mu.Lock()
	closed, abandoned := r.closed, r.abandoned
	if !closed && !abandoned {
		r.sessions[s] = struct{}{}
	}
	r.mu.Unlock()
	switch {
	case abandoned:
		stop()
		return nil, fmt.Errorf("%s: %w", what, errAbandoned)
	case closed:
		stop()
		rctx, cancel := context.WithTimeout(context.Background(), r.opts.DialTimeout.D())
		cli.Revoke(rctx, lease) // revoke what was just granted
		cancel()
		return nil, fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
	}
	go r.keep(kctx, cli, s, granted)
	return s, nil
}

// keep renews s's lease every ttl/4 until ctx is done or the lease is lost,
// then closes s.done. It gives up when no renewal succeeded for 2/3 of the
// ttl, counted from when the last successful one was sent (etcd renews no
// earlier), and no renewal request runs past that point: etcd expires the
// lease ttl after the last renewal it received, and a leader must stop
// before another can be elected. (The etcd client's own keepalive would
// notice only ttl after the last answer it received, up to half a second
// late: after etcd may have elected another.)
func (r *Registry) keep(ctx context.Context, cli *clientv3.Client, s *session, granted time.Time) {
	defer close(s.done)
	last := granted
	for {
		deadline := last.Add(s.ttl * 2 / 3)
		if !sleep(ctx, min(s.ttl/4, time.Until(deadline))) {
			return
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			r.log.Warn("etcd: election session not renewed in 2/3 of its ttl; given up", "lease", fmt.Sprintf("%x", s.lease))
			return
		}
		rctx, cancel := context.WithTimeout(ctx, min(r.opts.DialTimeout.D(), deadline.Sub(sent)))
		_, err := cli.KeepAliveOnce(rctx, s.lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			r.log.Warn("etcd: election session's lease is gone", "lease", fmt.Sprintf("%x", s.lease))
			return
		case err == nil:
			last = sent
		}
	}
}

// dropSession stops renewing sess and revokes it in the background (a
// campaign that ends must not wait for etcd), unless the registry already
// took it over for Close or AbandonLeases.
func (r *Registry) dropSession(sess *session) {
	sess.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, mine := r.sessions[sess]; !mine || r.abandoned {
		return
	}
	delete(r.sessions, sess)
	r.revoking.Go(func() { r.revokeSession(r.ctx, sess) })
}

// endSession stops renewing sess and revokes it within ctx, unless the
// registry already took it over for Close or AbandonLeases.
func (r *Registry) endSession(ctx context.Context, sess *session) error {
	sess.stop()
	r.mu.Lock()
	_, mine := r.sessions[sess]
	delete(r.sessions, sess)
	abandoned := r.abandoned
	r.mu.Unlock()
	if !mine || abandoned {
		return nil
	}
	return r.revokeSession(ctx, sess)
}

// revokeSession revokes sess's lease within ctx and dial_timeout; a lease
// already gone is no error.
func (r *Registry) revokeSession(ctx context.Context, sess *session) error {
	sess.stop()
	err := r.request(ctx, "revoke election session", func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Revoke(ctx, sess.lease)
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// electionEscaper escapes the two bytes that would let one election's keys
// fall under another's: an election's candidates are every key under its
// prefix, so unescaped, election "a"'s prefix <election_prefix>a/ would
// take in election "a/b"'s candidates, which would then hold up "a"'s
// campaigns and be named its leader. Escaping '%' keeps names apart.
var electionEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// electionKey is the prefix of election's candidates' keys:
// <election_prefix><election, '%' and '/' escaped>/.
func (r *Registry) electionKey(election string) string {
	return r.opts.ElectionPrefix + electionEscaper.Replace(election) + "/"
}

// Leader returns the id of election's current leader, or "" when there is
// none: who the others see winning.
func (r *Registry) Leader(ctx context.Context, election string) (string, error) {
	what := fmt.Sprintf("leader of %q", election)
	if err := r.usable(ctx, what); err != nil {
		return "", err
	}
	var leader string
	err := r.request(ctx, what, func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Get(ctx, r.electionKey(election), clientv3.WithFirstCreate()...)
		if err == nil && len(resp.Kvs) > 0 {
			leader = string(resp.Kvs[0].Value)
		}
		return err
	})
	return leader, err
}

// leadership is a won Campaign; its goroutine closes lost when the session
// ends, the leadership is resigned, or its key is found gone after a
// reconnection.
type leadership struct {
	r    *Registry
	sess *session
	key  string
	rev  int64 // key's creation revision
	lost chan struct{}
	once sync.Once // closes lost

	resignOnce sync.Once
	resignErr  error
	resigned   chan struct{}
}

var _ kernel.Leadership = (*leadership)(nil)

func (l *leadership) Lost() <-chan struct{} { return l.lost }

func (l *leadership) end() { l.once.Do(func() { close(l.lost) }) }

func (l *leadership) watch() {
	defer l.end()
	for {
		reconnected, _ := l.r.nextReconnect()
		select {
		case <-l.sess.done:
			return
		case <-l.resigned:
			return
		case <-reconnected:
		}
		// etcd may have been wiped or restored from a backup meanwhile, and
		// the key gone with the lease still there.
		var gone bool
		err := l.r.request(l.r.ctx, "check leader key", func(ctx context.Context, cli *clientv3.Client) error {
			resp, err := cli.Get(ctx, l.key)
			if err == nil {
				gone = len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.rev
			}
			return err
		})
		if err == nil && gone {
			l.r.log.Warn("etcd: the leader's key is gone; leadership lost", "key", l.key)
			l.r.dropSession(l.sess)
			return
		}
	}
}

// Resign gives up leadership: it closes Lost first, so that this process
// stops leading before another can, then deletes the leader's key, so that
// the next candidate takes over at once, and revokes the session.
func (l *leadership) Resign(ctx context.Context) error {
	l.resignOnce.Do(func() {
		l.end()
		var err error
		if !l.sess.isDone() {
			err = l.r.request(ctx, "resign", func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)).Then(clientv3.OpDelete(l.key)).Commit()
				return err
			})
		}
		l.resignErr = errors.Join(err, l.r.endSession(ctx, l.sess))
		close(l.resigned)
	})
	if errors.Is(l.resignErr, kernel.ErrClosed) {
		return nil // Close revoked the session: nothing is left to resign
	}
	return l.resignErr
}
