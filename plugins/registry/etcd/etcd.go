// Package etcd is a service registry on an etcd v3 cluster: servers in any
// process register instances under one lease per registry, clients resolve
// and watch them through a local cache, and leaders are elected the way etcd's
// concurrency recipe does. docs/registry-etcd.md tells the whole design.
//
// Config name: "etcd". Options, with defaults:
//
//	registry:
//	  name: etcd
//	  options:
//	    endpoints: ["127.0.0.1:2379"]     # etcd members, host:port or URL
//	    dial_timeout: 5s                  # bounds connecting and each request a call waits on
//	    ttl: 10s                          # lease of a Register given ttl 0, and of election sessions
//	    prefix: /kernrpc/services/        # keys are <prefix><service>/<instance-id>
//	    election_prefix: /kernrpc/elections/  # elections are under <election_prefix><election>/ ('%' and '/' escaped)
//	    shared_prefix: /kernrpc/shared/   # shared entries (kernel.SharedStore) are <shared_prefix><key>
//	    username: ""                      # with password: etcd authentication
//	    password: ""
//	    tls:                              # absent (the default): plain TCP
//	      ca_file: ""                     # PEM roots; the system's when empty
//	      cert_file: ""                   # client certificate, with key_file
//	      key_file: ""
//	      server_name: ""                 # name to verify in the server's certificate
//	      insecure_skip_verify: false     # tests only
//	    load_report_interval: 5s          # least time between two load writes of one instance
//
// Keys and values. An instance is the key <prefix><service>/<instance-id>
// holding the JSON {"address", "metadata", "load": {"in_flight", "qps",
// "updated"}}; "transport" and "codec" are metadata keys, as
// kernel.Instance has them. A prefix not ending in "/" gets one. A service
// name must not contain "/"; an address or metadata that is not UTF-8
// (JSON would mangle it) is refused.
//
// Leases. All of one registry's instances are attached to ONE lease, kept
// alive by the etcd client's single KeepAlive stream: a steady state costs
// no write at all, only the client's keepalive messages (every TTL/3). The
// lease's TTL is the largest ttl any Register of this registry asked for
// (ttl 0 stands for the ttl option), rounded up to whole seconds, as etcd
// counts them; a Register asking for more than the current lease moves
// every instance to a new, longer lease. So an instance registered with a
// shorter ttl beside a longer one lingers up to the longer one when its
// process dies.
//
// Re-registration happens only when the lease is really lost: its
// KeepAlive channel closes, which the client does when etcd answers that
// the lease expired or when no keepalive was answered for a whole TTL.
// Then the registry grants one new lease and puts every instance again, in
// one transaction per 64 instances (fewer when their values pass 1 MiB),
// once; until etcd answers it retries,
// without writing, at most once a second plus dial_timeout.
//
// Discovery. The first Resolve or Watch of a service reads its keys once
// and starts one watch on its prefix, which feeds a local cache: later
// Resolves answer from memory and never wait on etcd. The watch resumes
// from its last revision after a disconnect; when that revision has been
// compacted away, the service is read whole once more. A service once
// resolved is watched until Close. After each reconnection to etcd, a
// watch checks (one keys-only Get as of its revision) that etcd still has
// the history it followed, and the lease that its keys are there: an etcd
// wiped or restored from an older backup is read whole again, and the
// instances are registered again.
//
// Load reports (kernel.LoadReporter) rewrite the instance's value under the
// same lease, at most once per load_report_interval per instance: a report
// sooner than that is coalesced, and the latest one is written when the
// interval ends; when that write fails, at the end of the next interval.
//
// Elections (kernel.Elector) queue candidates by creation revision, as
// concurrency.Election does, each Campaign on a session (a lease of the ttl
// option) of its own, renewed by the registry: a leader whose process dies
// is replaced once its session's lease expires, within ttl, and a leader
// that cannot renew gives up within 2/3 of it, before that.
//
// Shared entries (kernel.SharedStore, for plugins that keep one state
// across the clients of a service, such as the breaker's share: registry)
// are the keys <shared_prefix><key> holding the plugin's bytes, each on a
// lease that is never kept alive: it ends ttl (rounded up to seconds) to
// ttl+1s after the put. A lease takes the puts of its ttl for a second
// after its grant, so a burst of puts costs one grant. Close revokes
// them, so the entries of a closed registry go at once, and those of a
// dead process within ttl+1s. WatchShared reads the prefix, then watches
// it like a service, resuming and reading again the same way.
//
// A dead etcd is not a hang: New does not dial; the first call that needs
// etcd fails after dial_timeout, naming the endpoints.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the registry's config name.
const Name = "etcd"

// Factory builds etcd registries; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"service registry on etcd v3: one lease per registry, watched local cache, leader election, shared entries",
	DefaultOptions,
	func(o *Options) (kernel.Registry, error) { return New(*o) })

func init() { kernel.RegisterRegistry(Factory) }

var (
	_ kernel.Registry             = (*Registry)(nil)
	_ kernel.LoadReporter         = (*Registry)(nil)
	_ kernel.Elector              = (*Registry)(nil)
	_ kernel.RegistryCapabilities = (*Registry)(nil)
	_ kernel.LeaseAbandoner       = (*Registry)(nil)
	_ kernel.SharedStore          = (*Registry)(nil)
)

// Registry is one client of an etcd cluster. It owns the lease its
// instances live under (and the goroutine that watches it), the watches of
// the services it resolved, and its election sessions; Close ends them all.
type Registry struct {
	opts  Options
	cfg   clientv3.Config
	log   *slog.Logger
	stats stats

	// ctx lives until Close; background requests and watches run under it.
	ctx    context.Context
	cancel context.CancelFunc

	clientMu sync.Mutex
	cli      *clientv3.Client // dialled by the first call that needs etcd
	connDone chan struct{}    // closed when watchConnection returns

	// reconnected is closed, and replaced, each time the connection to
	// etcd is ready again after it was lost (watchConnection).
	reconnMu    sync.Mutex
	reconnected chan struct{}
	reconnects  uint64 // how many times reconnected was closed

	keeper *leaseKeeper
	shared sharedLeases // the leases of the shared entries it put (shared.go)

	// mu guards the fields below.
	mu        sync.Mutex
	closed    bool
	abandoned bool
	services  map[string]*serviceCache
	sessions  map[*session]struct{}
	caches    sync.WaitGroup // the services' watch goroutines
	revoking  sync.WaitGroup // revocations of dropped election sessions
}

// New builds a registry from opts. It does not dial: a registry of an
// unreachable cluster builds, and its first call fails within dial_timeout.
func New(opts Options) (*Registry, error) {
	opts, err := opts.check()
	if err != nil {
		return nil, err
	}
	cfg, err := opts.clientConfig()
	if err != nil {
		return nil, err
	}
	// Reconnect at most a second apart, so that a restarted etcd is found
	// again well within a lease's TTL (gRPC's default backs off to 2 min).
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: opts.DialTimeout.D(),
	}))
	ctx, cancel := context.WithCancel(context.Background())
	r := &Registry{
		opts:     opts,
		cfg:      cfg,
		log:      slog.Default().With("registry", Name),
		ctx:      ctx,
		cancel:   cancel,
		services: make(map[string]*serviceCache),
		sessions: make(map[*session]struct{}),

		reconnected: make(chan struct{}),
	}
	r.keeper = newLeaseKeeper(r)
	return r, nil
}

// HonoursTTL reports that instances expire when their lease is not renewed.
func (r *Registry) HonoursTTL() bool { return true }

// client returns the etcd client, dialling it on first use. Without
// credentials clientv3.New does not wait for the cluster; with them it
// authenticates, within dial_timeout.
func (r *Registry) client() (*clientv3.Client, error) {
	r.clientMu.Lock()
	defer r.clientMu.Unlock()
	if r.ctx.Err() != nil {
		return nil, errClosed
	}
	if r.cli != nil {
		return r.cli, nil
	}
	cli, err := clientv3.New(r.cfg)
	if err != nil {
		return nil, r.unreachable(err)
	}
	r.cli = cli
	r.connDone = make(chan struct{})
	go r.watchConnection(cli.ActiveConnection(), r.connDone)
	return cli, nil
}

// watchConnection tells the watches each time the connection to etcd is
// ready again after it was lost (closing r.reconnected), until Close. The
// etcd client resumes a broken watch by itself, from the revision after
// the last it received; a watch checks then that etcd did not go back
// behind that revision (watchFrom). It costs nothing while connected.
func (r *Registry) watchConnection(conn *grpc.ClientConn, done chan struct{}) {
	defer close(done)
	state, lost := conn.GetState(), false
	for {
		if state == connectivity.Ready && lost {
			lost = false
			r.reconnMu.Lock()
			close(r.reconnected)
			r.reconnected = make(chan struct{})
			r.reconnects++
			r.reconnMu.Unlock()
		}
		if !conn.WaitForStateChange(r.ctx, state) {
			return // closed
		}
		// Whatever came between, it left Ready: the next Ready is a
		// reconnection.
		lost = lost || state == connectivity.Ready
		state = conn.GetState()
	}
}

// nextReconnect is closed at the next reconnection to etcd; gen counts
// the reconnections before it.
func (r *Registry) nextReconnect() (next <-chan struct{}, gen uint64) {
	r.reconnMu.Lock()
	defer r.reconnMu.Unlock()
	return r.reconnected, r.reconnects
}

// unreachable explains err, a request that ran out of dial_timeout, with
// what a probe of the endpoints found.
func (r *Registry) unreachable(err error) error {
	endpoints := strings.Join(r.opts.Endpoints, ",")
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcd at %s: %w", endpoints, err)
	}
	why := r.probe()
	if why == "" {
		why = "is etcd running there?"
	}
	return fmt.Errorf("no answer from etcd at %s within dial_timeout %s (%s): %w", endpoints, r.opts.DialTimeout, why, err)
}

// request runs one etcd request f under ctx, bounded by dial_timeout, and
// words its error: the caller's own ctx ending, or etcd not answering.
func (r *Registry) request(ctx context.Context, what string, f func(context.Context, *clientv3.Client) error) error {
	cli, err := r.client()
	if err != nil {
		return fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.DialTimeout.D())
	defer cancel()
	err = f(rctx, cli)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %s: %w", Name, what, context.Cause(ctx))
	case r.ctx.Err() != nil:
		return fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
	case rctx.Err() != nil:
		return fmt.Errorf("%s: %s: %w", Name, what, r.unreachable(context.DeadlineExceeded))
	}
	return fmt.Errorf("%s: %s: %w", Name, what, err)
}

// usable is nil while the registry may still be used.
func (r *Registry) usable(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
	}
	return nil
}

// Close revokes this registry's lease, which removes every instance it
// registered in one step, revokes the leases of the shared entries it put
// (they go too), revokes its election sessions (their leaderships
// end), ends its watches (closing their channels) and its connection. After
// AbandonLeases it revokes nothing: the process is playing dead. It is
// idempotent.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	abandoned := r.abandoned
	sessions := r.sessions
	r.sessions = nil
	services := r.services
	r.services = nil
	r.mu.Unlock()

	var errs []error
	for s := range sessions {
		s.stop()
		if abandoned {
			continue
		}
		if err := r.revokeSession(r.ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("%s: close: %w", Name, err))
		}
	}
	if err := r.keeper.close(!abandoned); err != nil {
		errs = append(errs, err)
	}
	if !abandoned {
		if err := r.revokeShared(); err != nil {
			errs = append(errs, err)
		}
	}
	r.cancel()
	r.caches.Wait()
	r.revoking.Wait()
	for _, c := range services {
		c.closeSubscribers()
	}
	r.clientMu.Lock()
	cli, connDone := r.cli, r.connDone
	r.cli = nil
	r.clientMu.Unlock()
	if cli != nil {
		<-connDone // r.ctx is done: watchConnection returns
		cli.Close()
	}
	return errors.Join(errs...)
}

// AbandonLeases stops renewing this registry's lease and its election
// sessions without revoking them, as if its process had died: its
// instances disappear, and its leaderships pass to others, within their
// ttl. Register and ReportLoad fail from then on. It is for tests
// (kernel.LeaseAbandoner).
func (r *Registry) AbandonLeases() {
	r.mu.Lock()
	r.abandoned = true
	sessions := make([]*session, 0, len(r.sessions))
	for s := range r.sessions {
		sessions = append(sessions, s)
	}
	r.mu.Unlock()
	r.keeper.abandon()
	for _, s := range sessions {
		s.stop()
	}
}

func (r *Registry) isAbandoned() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abandoned
}
