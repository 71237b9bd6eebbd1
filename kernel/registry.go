package kernel

import (
	"context"
	"time"
)

// Instance is one running server of a service, as a registry knows it.
type Instance struct {
	// Service is the name clients resolve.
	Service string
	// ID is unique among the service's instances; the server derives it from
	// its address unless configured.
	ID string
	// Address is what the client's transport dials.
	Address string
	// Metadata is free-form; by convention "transport", "codec" and "weight"
	// (an integer, for weighted balancers).
	Metadata map[string]string
	// Load is the last load the instance reported; zero when unknown.
	Load Load
}

// Load is what an instance reports of its own busyness, at a bounded rate,
// for load-aware balancers.
type Load struct {
	InFlight int64   // calls being handled now
	QPS      float64 // calls completed per second, recently
	Updated  time.Time
}

// Registry is service discovery: servers register instances under a lease,
// clients resolve and watch them.
type Registry interface {
	// Register announces inst for ttl. The registry keeps the lease alive
	// until Deregister or Close; if it cannot, the instance disappears
	// within ttl. A ttl of 0 means the registry's default.
	Register(ctx context.Context, inst Instance, ttl time.Duration) error
	// Deregister removes inst (matched by Service and ID).
	Deregister(ctx context.Context, inst Instance) error
	// Resolve returns the live instances of service; an empty slice (not an
	// error) when there are none.
	Resolve(ctx context.Context, service string) ([]Instance, error)
	// Watch sends the full set of service's instances, first the current set,
	// then again after every change, until ctx is done; then it closes the
	// channel. A slow receiver sees only the latest set.
	Watch(ctx context.Context, service string) (<-chan []Instance, error)
	// Close deregisters everything this registry registered and releases its
	// connections. It is idempotent.
	Close() error
}

// Notifier is an optional Registry interface: the changes of a service's
// instances handed to a function instead of sent on a channel, so that a
// watcher keeps no goroutine of its own waiting while nothing changes. The
// engine's client uses it where a registry offers it: a client made for
// one call (a short connection) then starts no goroutine for its registry.
type Notifier interface {
	// Notify returns service's instances, as Resolve lists them, and from
	// then on calls fn with the full set after every change, with none
	// missed in between, until stop is called or the registry is closed.
	// Calls of fn do not overlap; one that falls behind gets only the
	// latest set. fn must not block for long, nor call stop or Close.
	// ctx bounds Notify alone. Once stop returns, fn is not running and
	// will not be called again; stop may be called more than once.
	Notify(ctx context.Context, service string, fn func([]Instance)) (current []Instance, stop func(), err error)
}

// LoadReporter is an optional Registry interface: publish an instance's load
// so that other processes' balancers can see it. ReportLoad sets the Load
// of inst (matched by Service and ID), an instance this registry
// registered, which Resolve and Watch then show; a report of an instance
// that is not registered (never, or no longer) fails and registers
// nothing: a load report is not a lease.
type LoadReporter interface {
	ReportLoad(ctx context.Context, inst Instance, load Load) error
}

// Elector is an optional Registry interface offered by registries that can
// run a leader election (etcd, consul).
type Elector interface {
	// Campaign blocks until id is leader of election or ctx is done. The
	// returned Leadership ends when resigned or when the lease is lost.
	Campaign(ctx context.Context, election, id string) (Leadership, error)
}

// Leadership is held after winning a Campaign.
type Leadership interface {
	// Lost is closed when leadership ends for any reason.
	Lost() <-chan struct{}
	// Resign gives up leadership.
	Resign(ctx context.Context) error
}

// RegistryCapabilities is optional: a registry says what it supports so that
// plugintest can skip what does not apply, with the reason.
type RegistryCapabilities interface {
	// HonoursTTL is false for registries whose entries never expire (a
	// static list from config).
	HonoursTTL() bool
}

// LeaseAbandoner is an optional Registry interface that simulates a crash:
// from AbandonLeases on, the registry renews none of its leases, as if its
// process had died, so the instances it registered disappear within their
// ttl. It exists for tests: plugintest checks lease expiry through it (and
// skips that check for a registry without it); a server never calls it.
type LeaseAbandoner interface {
	AbandonLeases()
}

// SharedStore is an optional Registry interface: a small key-value store
// shared by every process that uses the same registry (one etcd cluster,
// one memory namespace), for plugins that keep one state across the
// clients of a service, such as the breaker filter's. Keys are paths the
// plugin chooses ("breaker/<service>/<key>"); the registry keeps them
// apart from its instances. Values are small (a few hundred bytes).
type SharedStore interface {
	// PutShared sets key to value. The entry disappears ttl after the
	// last put (a ttl of 0 means the registry's default), or when this
	// registry is closed or its process dies: state nobody renews is
	// forgotten.
	PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error
	// DeleteShared removes key; removing a missing key is not an error.
	DeleteShared(ctx context.Context, key string) error
	// WatchShared calls fn with every entry under prefix as it is now,
	// then with every change, from one goroutine at a time, until ctx is
	// done; a removed or expired entry comes with a nil value. It returns
	// once the current entries have been given to fn. An error after that
	// (a lost connection) is retried by the registry, which then gives fn
	// every entry again, and nil for those that went meanwhile. fn must
	// not block for long, nor close the registry.
	WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error
}
