// Package memory is the in-process service registry, kernrpc's default.
// Every memory registry in a process that has the same namespace sees the
// same instances: a package-level store per namespace is this plugin's
// backend, the way an etcd cluster is the backend of the etcd plugin. It
// does not cross process boundaries; a client of a server in another process
// lists the server under static.
//
// Config name: "memory". Options, with defaults:
//
//	registry:
//	  name: memory
//	  options:
//	    namespace: default   # registries with the same namespace share instances
//	    default_ttl: 10s     # lease of a Register given a ttl of 0
//	    static: {}           # service -> [address, ...], served from config
//
// Static instances never expire and have ID = Address = the address given;
// Resolve and Watch list them first, in config order, then the registered
// instances sorted by ID. Registered instances live under a lease that
// the registry which registered them keeps until Deregister or Close, in
// one process however busy the machine. After AbandonLeases
// (kernel.LeaseAbandoner, a test's stand-in for a process that died) they
// disappear, and watchers hear of it, ttl later.
//
// The registry is a kernel.Notifier (notify.go): Notify hands a function
// each change, on a goroutine that exists only while changes are being
// handed over, so a client following a service through it keeps none
// waiting.
//
// The registry is a kernel.SharedStore too (shared.go): a namespace holds
// small key-value entries beside its instances, each put for a ttl
// (default_ttl when 0) and not renewed: it goes ttl after its last put,
// when it is deleted, or when the registry that put it last is closed.
// Each WatchShared has a goroutine of its own that hands fn the changes,
// coalesced by key when fn is slower than they come.
package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the registry's config name.
const Name = "memory"

// Options configures a memory registry.
type Options struct {
	// Namespace picks the in-process store; registries with the same
	// namespace see the same instances.
	Namespace string `json:"namespace"`
	// Static lists instances by service: addresses served from config,
	// never expiring, with ID = address.
	Static map[string][]string `json:"static"`
	// DefaultTTL is the lease of a Register whose ttl is 0.
	DefaultTTL kernel.Duration `json:"default_ttl"`
}

// DefaultOptions returns the options with their defaults.
func DefaultOptions() *Options {
	return &Options{Namespace: "default", DefaultTTL: kernel.Duration(10 * time.Second)}
}

// Factory builds memory registries; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"in-process registry: registries with the same namespace share instances; static lists from config",
	DefaultOptions,
	func(o *Options) (kernel.Registry, error) { return New(*o) })

func init() { kernel.RegisterRegistry(Factory) }

var (
	_ kernel.Registry             = (*Registry)(nil)
	_ kernel.LoadReporter         = (*Registry)(nil)
	_ kernel.RegistryCapabilities = (*Registry)(nil)
	_ kernel.LeaseAbandoner       = (*Registry)(nil)
	_ kernel.Notifier             = (*Registry)(nil)
)

// Registry is one handle on a namespace's store. It owns the instances it
// registers and the watches started through it; Close ends both.
type Registry struct {
	store      *store
	static     map[string][]kernel.Instance
	defaultTTL time.Duration

	// mu guards the fields below. Lock order: Registry.mu, then store.mu.
	mu      sync.Mutex
	closed  bool
	owned   map[instanceKey]time.Duration // what this registry registered, with its ttl
	watches map[*watcher]func() bool      // each watch with the stop of its context.AfterFunc (nil for Notify's)
	// sharedWatches are the WatchShared calls made through this registry
	// whose goroutine still runs (shared.go).
	sharedWatches map[*sharedWatch]struct{}
	// abandoned is set by AbandonLeases (tests): this registry keeps no
	// lease any more, so its instances expire as if its process died.
	abandoned bool
}

// New opens a registry on the store of opts.Namespace.
func New(opts Options) (*Registry, error) {
	if opts.Namespace == "" {
		return nil, errors.New(`memory: option "namespace" is empty; leave it out for "default"`)
	}
	if opts.DefaultTTL <= 0 {
		return nil, fmt.Errorf(`memory: option "default_ttl" must be positive, got %s`, opts.DefaultTTL)
	}
	static, err := staticInstances(opts.Static)
	if err != nil {
		return nil, err
	}
	return &Registry{
		store:      acquireStore(opts.Namespace),
		static:     static,
		defaultTTL: opts.DefaultTTL.D(),
		owned:      make(map[instanceKey]time.Duration),
		watches:    make(map[*watcher]func() bool),

		sharedWatches: make(map[*sharedWatch]struct{}),
	}, nil
}

func staticInstances(static map[string][]string) (map[string][]kernel.Instance, error) {
	out := make(map[string][]kernel.Instance, len(static))
	for service, addrs := range static {
		if service == "" {
			return nil, errors.New(`memory: option "static": empty service name`)
		}
		seen := make(map[string]bool, len(addrs))
		for i, a := range addrs {
			if a == "" {
				return nil, fmt.Errorf(`memory: option "static": service %q: address %d is empty`, service, i)
			}
			if seen[a] {
				return nil, fmt.Errorf(`memory: option "static": service %q: address %q is listed twice`, service, a)
			}
			seen[a] = true
			out[service] = append(out[service], kernel.Instance{Service: service, ID: a, Address: a})
		}
	}
	return out, nil
}

// HonoursTTL reports that registered instances expire when not kept alive.
func (r *Registry) HonoursTTL() bool { return true }

// Register announces inst under a lease of ttl (the default_ttl option when
// 0), kept until Deregister or Close. Registering the same Service
// and ID again replaces the instance, and the lease moves to this registry.
func (r *Registry) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: register: %w", err)
	}
	switch {
	case inst.Service == "":
		return errors.New("memory: register: instance has an empty Service")
	case inst.ID == "":
		return fmt.Errorf("memory: register %s: instance has an empty ID", inst.Service)
	case inst.Address == "":
		return fmt.Errorf("memory: register %s/%s: instance has an empty Address", inst.Service, inst.ID)
	case ttl < 0:
		return fmt.Errorf("memory: register %s/%s: negative ttl %s", inst.Service, inst.ID, ttl)
	case ttl == 0:
		ttl = r.defaultTTL
	}
	inst.Metadata = maps.Clone(inst.Metadata) // the store owns its copy

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("memory: register %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	}
	key := instanceKey{inst.Service, inst.ID}
	r.owned[key] = ttl
	var expires time.Time // none while this registry keeps the lease
	if r.abandoned {
		expires = time.Now().Add(ttl)
	}
	r.store.put(inst, r, expires)
	return nil
}

// Deregister removes inst, matched by Service and ID, whichever registry
// registered it. Removing an instance that is not there is not an error.
func (r *Registry) Deregister(ctx context.Context, inst kernel.Instance) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: deregister: %w", err)
	}
	key := instanceKey{inst.Service, inst.ID}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("memory: deregister %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	}
	delete(r.owned, key)
	r.store.remove(key, nil)
	return nil
}

// ReportLoad stores load in the registered instance matched by Service and
// ID; Resolve and Watch show it. A zero load.Updated is set to now.
func (r *Registry) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: report load: %w", err)
	}
	if load.Updated.IsZero() {
		load.Updated = time.Now()
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return fmt.Errorf("memory: report load of %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	}
	if !r.store.setLoad(instanceKey{inst.Service, inst.ID}, load) {
		return fmt.Errorf("memory: report load of %s/%s: no such instance is registered in namespace %q (register it first; it may have expired)",
			inst.Service, inst.ID, r.store.namespace)
	}
	return nil
}

// Resolve returns a fresh slice of service's instances: the static ones
// first, then the registered ones sorted by ID.
func (r *Registry) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: resolve %s: %w", service, err)
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("memory: resolve %s: %w", service, kernel.ErrClosed)
	}
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	return withStatic(r.static[service], r.store.liveLocked(service)), nil
}

// Watch sends service's instances (as Resolve lists them) now and after
// every change, including expiries. A slow receiver gets only the latest
// set; the store never waits for it. The channel is closed when ctx is done
// or the registry is closed.
func (r *Registry) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: watch %s: %w", service, err)
	}
	w := &watcher{service: service, static: r.static[service], ch: make(chan []kernel.Instance, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("memory: watch %s: %w", service, kernel.ErrClosed)
	}
	r.store.watch(w)
	r.watches[w] = context.AfterFunc(ctx, func() { r.endWatch(w) })
	return w.ch, nil
}

func (r *Registry) endWatch(w *watcher) {
	r.store.unwatch(w)
	r.mu.Lock()
	delete(r.watches, w)
	r.mu.Unlock()
}

// Close deregisters every instance this registry registered and still
// holds, removes the shared entries it put last and ends its watches
// (shared ones too). It is idempotent.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	for key := range r.owned {
		r.store.remove(key, r)
	}
	clear(r.owned)
	r.store.dropSharedOf(r)
	watches := r.watches
	r.watches = nil
	shared := maps.Clone(r.sharedWatches)
	r.mu.Unlock()

	r.endSharedWatches(shared)

	for w, stop := range watches {
		if stop != nil {
			stop()
		}
		r.store.unwatch(w)
	}
	releaseStore(r.store)
	return nil
}

// AbandonLeases stops keeping this registry's leases without deregistering
// anything, as if its process had died: its instances expire ttl later,
// and any it registers from now on ttl after their Register. It is for
// tests (kernel.LeaseAbandoner).
func (r *Registry) AbandonLeases() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned {
		return
	}
	r.abandoned = true
	now := time.Now()
	for key, ttl := range r.owned {
		if !r.store.setExpiry(key, r, now.Add(ttl)) {
			delete(r.owned, key) // another registry took it over, or it is gone
		}
	}
}
