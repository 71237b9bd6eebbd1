// Package consul is a kernrpc service registry on HashiCorp Consul: servers
// register through the local Consul agent with a TTL check they keep
// passing, clients discover through blocking queries on the health endpoint
// into a local cache, leaders are elected through a session and a KV lock,
// and shared entries (kernel.SharedStore, the breaker's share: registry)
// are KV keys kernrpc/shared/<key> whose values carry their own expiry.
// docs/registry-consul.md says how each part works, what it costs and what
// it was verified against.
//
// Config name: "consul". Options, with defaults:
//
//	registry:
//	  name: consul
//	  options:
//	    address: ""          # host:port, unix:///path, or http(s)://host:port of the agent;
//	                         # empty: $CONSUL_HTTP_ADDR if set, else 127.0.0.1:8500
//	    scheme: ""           # http or https; empty: from the address, else http
//	    token: ""            # ACL token; empty: $CONSUL_HTTP_TOKEN, if set
//	    datacenter: ""       # empty: the agent's own
//	    ttl: 10s             # TTL check of a Register given a ttl of 0; passed every ttl/3
//	    deregister_critical_service_after: 1m  # the agent removes an instance critical this long
//	    wait_time: 30s       # longest wait of one blocking query (Consul caps it at 10m)
//	    timeout: 5s          # bound of every request that is not a blocking query, and of dialling
//	    session_ttl: 20s     # a dead leader is replaced within it; Consul gets half, which must be
//	                         # at least the agent's session_ttl_min (10s by default)
//	    load_report_interval: 5s  # at most one load write per instance per interval
//	    tls:                 # with scheme https (or an https:// address)
//	      ca_file: ""
//	      ca_path: ""
//	      cert_file: ""      # client certificate, with key_file
//	      key_file: ""
//	      server_name: ""    # name to verify the agent's certificate against
//	      insecure_skip_verify: false
//
// An instance is a Consul service: its Consul ID is derived from the
// kernrpc service and instance ID (readable, plus a hash so that any ID
// fits a URL path), its TTL check is "service:<that ID>", and its ID,
// address and metadata are one JSON document spread over service Meta
// values, which round-trips keys and values Consul's Meta rules refuse.
// The JSON of one instance must fit 62 Meta values of 512 bytes (31744
// bytes). Resolve serves a cache per service that a blocking query loop
// keeps current: only the first Resolve or Watch of a service waits for
// Consul, bounded by timeout, and the cache lives until Close.
package consul

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the registry's config name.
const Name = "consul"

// Factory builds consul registries; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"Consul: agent registration with a TTL check, discovery by blocking queries, elections by session lock, shared entries in KV",
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

// Registry is one client of a Consul agent. It owns what it registered
// (and the goroutine passing their TTL checks), the discovery caches and
// the election sessions it started; Close ends them all.
type Registry struct {
	cfg       config
	client    *api.Client
	transport *http.Transport
	log       *slog.Logger
	writer    string // names this registry in the shared entries it writes

	// life ends every background goroutine; wg counts them.
	life context.Context
	end  context.CancelFunc
	wg   sync.WaitGroup

	// mu guards the fields below. Lock order: Registry.mu, then a
	// registration's or a cache's own mutex.
	mu          sync.Mutex
	closed      bool
	abandoned   bool                     // AbandonLeases: renew nothing more
	owned       map[string]*registration // by Consul service ID
	keeper      chan struct{}            // wakes the keeper; nil until the first Register
	caches      map[string]*serviceCache // by service
	leaderships map[*leadership]struct{}
	sharedOwn   map[string]struct{} // shared keys this registry wrote last, for Close
	// heartbeat ends the renewals (TTL passes, session renewals) on
	// AbandonLeases, and on Close.
	heartbeat     context.Context
	stopHeartbeat context.CancelFunc
}

// New builds a registry from opts. It does not contact Consul: a dead
// agent shows at the first Register, Resolve, Watch or Campaign.
func New(opts Options) (*Registry, error) {
	cfg, err := opts.config()
	if err != nil {
		return nil, err
	}
	client, transport, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	heartbeat, stopHeartbeat := context.WithCancel(life)
	return &Registry{
		cfg:           cfg,
		client:        client,
		transport:     transport,
		log:           slog.Default().With("registry", Name, "address", cfg.address),
		life:          life,
		end:           end,
		owned:         make(map[string]*registration),
		caches:        make(map[string]*serviceCache),
		leaderships:   make(map[*leadership]struct{}),
		sharedOwn:     make(map[string]struct{}),
		writer:        newWriterID(),
		heartbeat:     heartbeat,
		stopHeartbeat: stopHeartbeat,
	}, nil
}

// HonoursTTL reports that instances whose TTL check is not passed vanish.
func (r *Registry) HonoursTTL() bool { return true }

// AbandonLeases stops passing TTL checks, writing loads and renewing
// election sessions, without deregistering anything, as if the process had
// died: its instances go critical within their ttl (and leave discovery),
// its leaderships end at once (their Lost closes; another campaign wins
// once the session expires, within session_ttl). It is for tests
// (kernel.LeaseAbandoner).
func (r *Registry) AbandonLeases() {
	r.mu.Lock()
	r.abandoned = true
	r.mu.Unlock()
	r.stopHeartbeat()
}

// Close deregisters every instance this registry registered, resigns its
// leaderships, deletes the shared entries it wrote last, ends its watches
// and stops its goroutines. It is idempotent; having tried every
// deregistration and deletion, it returns their errors, if any, joined.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	owned := r.owned
	r.owned = nil
	leaderships := r.leaderships
	r.leaderships = nil
	caches := r.caches
	r.caches = nil
	sharedOwn := r.sharedOwn
	// A put still in flight records nothing more: Close goes through
	// these keys unlocked, and what lands after it expires.
	r.sharedOwn = nil
	if r.abandoned {
		sharedOwn = nil // as if the process had died: its entries expire
	}
	r.mu.Unlock()

	r.stopHeartbeat()
	var errs []error
	for _, reg := range owned {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.timeout)
		errs = append(errs, r.deregisterOwned(ctx, reg))
		cancel()
	}
	for l := range leaderships {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.timeout)
		l.resign(ctx)
		cancel()
	}
	errs = append(errs, r.deleteOwnShared(sharedOwn))
	r.end()
	for _, c := range caches {
		c.closeWatchers()
	}
	r.wg.Wait()
	r.transport.CloseIdleConnections()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consul: close: %w", err)
	}
	return nil
}

// fail wraps a Consul error with the operation and the agent's address,
// so that a dead or misconfigured agent is named where it shows.
func (r *Registry) fail(op string, err error) error {
	var se api.StatusError
	if errors.As(err, &se) {
		return fmt.Errorf("consul: %s: agent %s answered %d: %s", op, r.cfg.address, se.Code, se.Body)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("consul: %s: agent %s: no answer within the deadline (option \"timeout\" is %s): %w", op, r.cfg.address, r.cfg.timeout, err)
	}
	return fmt.Errorf("consul: %s: agent %s: %w", op, r.cfg.address, err)
}

// opContext bounds one request that is not a blocking query by the
// timeout option.
func (r *Registry) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.timeout)
}

// goBackground runs f on a goroutine that Close waits for.
func (r *Registry) goBackground(f func()) {
	r.wg.Go(f)
}

// sleep waits d or until ctx is done; it reports whether d passed.
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
