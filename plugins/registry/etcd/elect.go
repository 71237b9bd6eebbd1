package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/kernrpc/kernrpc/kernel"
)

// Campaign blocks until id leads election or ctx is done. Each campaign
// runs on a session of its own (a lease of the ttl option, kept alive by
// the client) under electionKey; the candidates queue by
// creation revision, as concurrency.Election does. The Leadership's Lost
// closes when it is resigned, when the session's lease is lost (this
// registry closed, AbandonLeases, or etcd unreachable for the ttl), and
// then another candidate takes over within ttl.
func (r *Registry) Campaign(ctx context.Context, election, id string) (kernel.Leadership, error) {
	what := fmt.Sprintf("campaign %q for %q", election, id)
	if err := r.usable(ctx, what); err != nil {
		return nil, err
	}
	if election == "" {
		return nil, fmt.Errorf("%s: %s: empty election name", Name, what)
	}
	if r.isAbandoned() {
		return nil, fmt.Errorf("%s: %w", what, errAbandoned)
	}
	sess, err := r.newSession(ctx, what)
	if err != nil {
		return nil, err
	}
	e := concurrency.NewElection(sess, r.electionKey(election))
	if err := e.Campaign(ctx, id); err != nil {
		r.endSession(sess)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %s: %w", Name, what, context.Cause(ctx))
		}
		return nil, fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	select {
	case <-sess.Done():
		// The lease went while waiting in line: Campaign's wait does not
		// notice that its own key is gone.
		r.endSession(sess)
		return nil, fmt.Errorf("%s: %s: the session's lease was lost while campaigning", Name, what)
	default:
	}
	l := &leadership{r: r, sess: sess, election: e, lost: make(chan struct{}), resigned: make(chan struct{})}
	go l.watch()
	return l, nil
}

// newSession grants a lease within dial_timeout (concurrency.NewSession
// would wait for etcd as long as its context lives) and keeps it alive
// until the registry closes.
func (r *Registry) newSession(ctx context.Context, what string) (*concurrency.Session, error) {
	ttl := r.ttlSeconds(0)
	var lease clientv3.LeaseID
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
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease), concurrency.WithTTL(int(ttl)), concurrency.WithContext(r.ctx))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: session: %w", Name, what, err)
	}
	r.mu.Lock()
	closed, abandoned := r.closed, r.abandoned
	if !closed && !abandoned {
		r.sessions[sess] = struct{}{}
	}
	r.mu.Unlock()
	switch {
	case abandoned:
		sess.Orphan()
		return nil, fmt.Errorf("%s: %w", what, errAbandoned)
	case closed:
		sess.Close() // revoke what was just granted
		return nil, fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
	}
	return sess, nil
}

// endSession revokes sess, unless the registry already took it over for
// Close or AbandonLeases.
func (r *Registry) endSession(sess *concurrency.Session) {
	r.mu.Lock()
	_, mine := r.sessions[sess]
	delete(r.sessions, sess)
	r.mu.Unlock()
	if mine {
		sess.Close()
	}
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
// ends or the leadership is resigned.
type leadership struct {
	r        *Registry
	sess     *concurrency.Session
	election *concurrency.Election
	lost     chan struct{}

	resignOnce sync.Once
	resigned   chan struct{}
}

var _ kernel.Leadership = (*leadership)(nil)

func (l *leadership) Lost() <-chan struct{} { return l.lost }

func (l *leadership) watch() {
	select {
	case <-l.sess.Done():
	case <-l.resigned:
	}
	close(l.lost)
}

// Resign gives up leadership: it deletes the leader's key, so that the next
// candidate takes over at once, and revokes the session. Lost is closed.
func (l *leadership) Resign(ctx context.Context) error {
	var err error
	l.resignOnce.Do(func() {
		select {
		case <-l.sess.Done():
			// Lost already; the key went with the lease.
		default:
			err = l.r.request(ctx, "resign", func(ctx context.Context, _ *clientv3.Client) error {
				return l.election.Resign(ctx)
			})
		}
		l.r.endSession(l.sess)
		close(l.resigned)
	})
	if errors.Is(err, kernel.ErrClosed) {
		return nil // Close revoked the session: nothing is left to resign
	}
	return err
}
