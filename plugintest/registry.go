package plugintest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// RegistryConfig tells Registry how to build and time the registry under
// test. Its zero value suits an in-process registry with default options.
type RegistryConfig struct {
	// Options is the registry's options block. The suite builds several
	// registries from it and expects them to share one backend (the same
	// etcd cluster, the same memory namespace), so that each sees what the
	// others register. A test of an in-process registry should give a
	// namespace of its own, so that parallel tests do not meet.
	Options map[string]any
	// TTL is the lease of the instances the Lease subtests register; 0
	// means 2s. Give the shortest lease the backend accepts: the Lease
	// subtests take about TTL+Tolerance.
	TTL time.Duration
	// Tolerance is how long the backend may take to show a change to its
	// clients (a registration, a watch update, a Close) and how long past
	// its TTL an unrenewed instance may linger; 0 means 2s. A backend that
	// expires leases lazily (etcd, consul) needs seconds.
	Tolerance time.Duration
	// MaxMetadataValue is the longest metadata value the backend stores;
	// 0 means 4096 bytes. The Metadata subtests register a value of
	// exactly this length beside short unusual ones: give the backend's
	// real limit (Consul's service meta stops at 512), not a smaller one.
	MaxMetadataValue int
}

func (c RegistryConfig) ttl() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return 2 * time.Second
}

func (c RegistryConfig) maxMetadataValue() int {
	if c.MaxMetadataValue > 0 {
		return c.MaxMetadataValue
	}
	return 4096
}

func (c RegistryConfig) tolerance() time.Duration {
	if c.Tolerance > 0 {
		return c.Tolerance
	}
	return 2 * time.Second
}

// registryLongTTL is the lease of instances that must not expire during a
// subtest; the registry keeps it alive anyway, so its length only matters
// to a registry that fails to.
const registryLongTTL = time.Minute

// Registry certifies the service registry f builds from cfg.Options. Every
// subtest registers under service names of its own (random, prefixed
// "plugintest-"), so a shared backend may be used, and closes the
// registries it opens. It checks:
//
//   - Lifecycle, Options: as for every plugin kind (use registers and
//     resolves an instance).
//   - Register/Visible: registered instances (with a ttl or with 0, the
//     default) resolve with their Service, ID and Address, and no other
//     service's instances come with them.
//   - Deregister/Removes: a deregistered instance no longer resolves; the
//     others still do.
//   - Deregister/ByServiceAndID: two services each with an instance of
//     the same ID (an ID is unique only among its service's instances)
//     both resolve, each with its own address, and deregistering one
//     leaves the other: instances are told apart by Service and ID.
//   - Resolve/UnknownService: a service nobody registered resolves to an
//     empty set, not an error.
//   - Metadata/Resolve, Metadata/Watch: an instance's Metadata arrives
//     unchanged through Resolve and through Watch: the conventional keys,
//     an empty value, a value of RegistryConfig.MaxMetadataValue bytes,
//     and values and keys a flattening encoding mangles (separators such
//     as , ; = & and newlines, quotes, %-escapes, + signs, surrounding
//     spaces, JSON, non-ASCII text, upper case and slashes in keys).
//   - Metadata/NotUTF8: metadata keys and values that are not UTF-8 (every
//     byte from 0x80 to 0xff, half a character) arrive unchanged, or
//     Register refuses them and registers nothing; never mangled (as JSON
//     mangles them into U+FFFD) or dropped.
//   - Resolve/KeptSet: a set Resolve returned is unchanged after later
//     registrations, re-registrations and deregistrations: a registry
//     must not write into slices or maps it has handed out.
//   - Watch/InitialSet, Watch/InitialEmptySet: a new watcher's first set is
//     the current one, even when empty.
//   - Watch/Additions, Watch/Removals: a watcher is sent the new set after
//     a Register and after a Deregister.
//   - Watch/Sequence: a watcher follows a run of changes through two
//     registries, each awaited before the next: additions, removals, an
//     instance registered again with new metadata and with a new address
//     (a change of an instance, not of the set's IDs), and a Close.
//   - Watch/KeptSets: the sets a watcher received earlier are unchanged
//     after the later changes it was sent.
//   - Watch/CancelCloses: the channel is closed once the watch's ctx is done.
//   - Shared/Resolve, Shared/Watch: two registries built from the same
//     options see each other's instances and changes.
//   - Close/Deregisters: what a registry registered disappears, for the
//     other registries, when it is closed.
//   - Close/DuringFirstUse: a Close of a fresh registry made while its
//     first Resolve and Watch are under way (a registry that reads or
//     dials on first use waits there) returns, and so do they, each within
//     Tolerance, although their ctx is not done: a Close must end what
//     waits on the registry, not leave it to the caller's ctx; a Watch
//     channel they returned closes once its ctx is done.
//   - SharedStore/...: when the registry implements kernel.SharedStore,
//     its entries, changes, expiry, removal at Close and the end of a
//     watch (registry_shared.go lists them); skipped otherwise.
//   - Notify/...: when the registry implements kernel.Notifier, the current
//     set, changes, calls that never overlap, and the end of deliveries at
//     stop and at Close (registry_notify.go lists them); skipped otherwise.
//   - Load/...: when the registry implements kernel.LoadReporter, a
//     reported load reaches Resolve and watchers of other registries, the
//     latest report wins, and a report for an instance not registered
//     fails and registers nothing (registry_load.go lists them); skipped
//     otherwise.
//   - Elector/...: when the registry implements kernel.Elector, one leader
//     at a time (a new one only once the last one's Lost closed), Resign
//     handing over, Close and a lost lease ending a leadership, and
//     Campaign ending with its ctx (registry_elector.go lists them);
//     skipped otherwise.
//   - Lease/Expires, Lease/WatchSeesExpiry: an instance whose registry
//     stopped renewing its lease (kernel.LeaseAbandoner) disappears within
//     TTL+Tolerance, for Resolve and for watchers. Skipped when the registry
//     reports kernel.RegistryCapabilities.HonoursTTL false, or does not
//     implement kernel.LeaseAbandoner.
//   - Lease/KeptAlive: the registry renews its leases itself: an instance
//     is still there after TTL+Tolerance.
//   - Concurrent: registering, deregistering and resolving from many
//     goroutines and two registries loses or mixes up nothing (run the
//     test with -race too).
//   - Leaks: two registries driven through registrations, a watch whose
//     reader stops reading with a change on its way and then cancels, a
//     Watch whose ctx was cancelled before the call, a watch cancelled
//     while its reader waits, a watch open when its registry closes, and
//     Resolve, Register and Watch after Close (each may fail, none may
//     panic or hang; a Watch channel must close once its ctx is done);
//     once both are closed, every goroutine their calls started must end
//     within Tolerance. Only goroutines started from the subtest's own
//     calls count, so tests running in parallel do not disturb it.
func Registry(t *testing.T, f kernel.Factory[kernel.Registry], cfg RegistryConfig) {
	t.Helper()
	registrySuite(wrap(t), f, cfg)
}

func registrySuite(t tb, f kernel.Factory[kernel.Registry], cfg RegistryConfig) {
	lifecycle(t, f, cfg.Options, func(t tb, r kernel.Registry) { registryUse(t, r, cfg) })
	s := registryRun{f: f, cfg: cfg}
	t.Run("Register", func(t tb) { t.Run("Visible", s.registerVisible) })
	t.Run("Deregister", func(t tb) {
		t.Run("Removes", s.deregisterRemoves)
		t.Run("ByServiceAndID", s.deregisterByServiceAndID)
	})
	t.Run("Resolve", func(t tb) {
		t.Run("UnknownService", s.resolveUnknown)
		t.Run("KeptSet", s.keptResolve)
	})
	t.Run("Metadata", func(t tb) {
		t.Run("Resolve", s.metadataResolve)
		t.Run("Watch", s.metadataWatch)
		t.Run("NotUTF8", s.metadataNotUTF8)
	})
	t.Run("Watch", func(t tb) {
		t.Run("InitialSet", s.watchInitialSet)
		t.Run("InitialEmptySet", s.watchInitialEmptySet)
		t.Run("Additions", s.watchAdditions)
		t.Run("Removals", s.watchRemovals)
		t.Run("CancelCloses", s.watchCancelCloses)
		t.Run("Sequence", s.watchSequence)
		t.Run("KeptSets", s.keptWatch)
	})
	t.Run("Shared", func(t tb) {
		t.Run("Resolve", s.sharedResolve)
		t.Run("Watch", s.sharedWatch)
	})
	t.Run("Close", func(t tb) {
		t.Run("Deregisters", s.closeDeregisters)
		t.Run("DuringFirstUse", s.closeDuringFirstUse)
	})
	t.Run("SharedStore", s.sharedStore) // registry_shared.go
	t.Run("Notify", s.notify)           // registry_notify.go
	t.Run("Load", s.load)               // registry_load.go
	t.Run("Elector", s.elector)         // registry_elector.go
	t.Run("Lease", s.lease)
	t.Run("Concurrent", s.concurrent)
	t.Run("Leaks", s.leaks)
}

// registryUse is the lifecycle's brief use of a registry: register an
// instance, see it resolve, deregister it.
func registryUse(t tb, r kernel.Registry, cfg RegistryConfig) {
	t.Helper()
	ctx := registryContext(t)
	service := registryService(t)
	in := registryInstance(service, "a")
	if err := r.Register(ctx, in, registryLongTTL); err != nil {
		t.Fatalf("Register(%s): %v; want nil", in.ID, err)
	}
	registryResolveUntil(t, r, service, []kernel.Instance{in}, cfg.tolerance(), "after Register")
	if err := r.Deregister(ctx, in); err != nil {
		t.Errorf("Deregister(%s): %v; want nil", in.ID, err)
	}
}

type registryRun struct {
	f   kernel.Factory[kernel.Registry]
	cfg RegistryConfig
}

// open builds a registry from the configured options and closes it when t
// ends.
func (s registryRun) open(t tb) kernel.Registry {
	t.Helper()
	r := build(t, s.f, s.cfg.Options)
	t.Cleanup(func() { r.Close() })
	return r
}

func (s registryRun) register(t tb, r kernel.Registry, in kernel.Instance, ttl time.Duration) {
	t.Helper()
	if err := r.Register(registryContext(t), in, ttl); err != nil {
		t.Fatalf("Register(%s/%s, ttl %s): %v; want nil", in.Service, in.ID, ttl, err)
	}
}

func (s registryRun) deregister(t tb, r kernel.Registry, in kernel.Instance) {
	t.Helper()
	if err := r.Deregister(registryContext(t), in); err != nil {
		t.Fatalf("Deregister(%s/%s): %v; want nil", in.Service, in.ID, err)
	}
}

func (s registryRun) watch(t tb, ctx context.Context, r kernel.Registry, service string) <-chan []kernel.Instance {
	t.Helper()
	ch, err := r.Watch(ctx, service)
	if err != nil {
		t.Fatalf("Watch(%s): %v; want nil", service, err)
	}
	return ch
}

func (s registryRun) registerVisible(t tb) {
	r := s.open(t)
	service := registryService(t)
	// A set resolved before the registrations must not be what is served
	// after them.
	registryResolveUntil(t, r, service, nil, s.cfg.tolerance(), "before any Register")
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, 0)
	s.register(t, r, registryInstance(service+"-other", "c"), registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{a, b}, s.cfg.tolerance(),
		"after registering a (ttl 1m) and b (ttl 0, the default) and c of another service")
}

// registerTwo registers instances a and b of service and waits until r
// resolves both.
func (s registryRun) registerTwo(t tb, r kernel.Registry, service string) (a, b kernel.Instance) {
	t.Helper()
	a, b = registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "after registering a and b")
	return a, b
}

func (s registryRun) deregisterRemoves(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b := s.registerTwo(t, r, service)
	s.deregister(t, r, a)
	registryResolveUntil(t, r, service, []kernel.Instance{b}, s.cfg.tolerance(), "after deregistering a")
}

// deregisterByServiceAndID registers an instance of the same ID in two
// services, as servers given IDs by a scheduler ("pod-0") do: a registry
// keeping instances by ID alone would let one replace or remove the other.
func (s registryRun) deregisterByServiceAndID(t tb) {
	r := s.open(t)
	service := registryService(t)
	other := service + "-other"
	a := kernel.Instance{Service: service, ID: "plugintest-shared-id", Address: "127.0.0.1:20001"}
	b := kernel.Instance{Service: other, ID: a.ID, Address: "127.0.0.1:20002"}
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	// An ID is unique only among its service's instances.
	both := "after registering ID " + a.ID + " in it and in service " + other + " too (IDs are unique per service only: keep instances by Service and ID)"
	registryResolveUntil(t, r, service, []kernel.Instance{a}, s.cfg.tolerance(), both)
	registryResolveUntil(t, r, other, []kernel.Instance{b}, s.cfg.tolerance(), strings.Replace(both, other, service, 1))
	s.deregister(t, r, a)
	registryResolveUntil(t, r, service, nil, s.cfg.tolerance(), "after deregistering ID "+a.ID)
	registryResolveUntil(t, r, other, []kernel.Instance{b}, s.cfg.tolerance(),
		"after deregistering ID "+a.ID+" of service "+service+" (Deregister matches by Service and ID)")
}

func (s registryRun) resolveUnknown(t tb) {
	r := s.open(t)
	service := registryService(t)
	set, err := r.Resolve(registryContext(t), service)
	if err != nil {
		t.Fatalf("Resolve of a service nobody registered: %v; want an empty set and no error "+
			"(a client resolving before its servers start must wait, not fail)", err)
	}
	if len(set) != 0 {
		t.Errorf("Resolve of a service nobody registered = %s; want an empty set", registryFormat(set))
	}
}

// registryMetadata is what the Metadata subtests register: the keys the
// kernel's conventions use, an empty value, a value of the longest length
// the backend stores, and values and keys that an encoding flattening
// metadata into one string (k=v,k=v; a query string; lines) or
// normalising it (trimming, lower-casing keys) does not return intact.
func registryMetadata(longest int) map[string]string {
	long := strings.Repeat("0123456789abcdef", longest/16+1)[:longest-1] + "."
	return map[string]string{
		"transport":           "tcp-lv",
		"codec":               "protobuf",
		"weight":              "3",
		"zone":                "eu-west, rack 7 = ünïcödé ✓",
		"empty":               "",
		"long":                long,
		"lines":               "first line\nsecond\tline\r\nthird",
		"separators":          "a=1;b=2&c=3,d|e",
		"quoted":              `"double" 'single' \back\slash`,
		"escaped":             "%41%2F+plus+space%20",
		"padded":              "  leading and trailing  ",
		"json":                `{"a":[1,2],"b":null}`,
		"Mixed-Case.Key/with": "keys keep their case and slashes",
		"ключ":                "значение",
	}
}

func (s registryRun) metadataResolve(t tb) {
	r := s.open(t)
	service := registryService(t)
	in := registryInstance(service, "a")
	in.Metadata = registryMetadata(s.cfg.maxMetadataValue())
	s.register(t, r, in, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{in}, s.cfg.tolerance(), "after registering an instance with metadata")
}

func (s registryRun) metadataWatch(t tb) {
	r := s.open(t)
	service := registryService(t)
	in := registryInstance(service, "a")
	in.Metadata = registryMetadata(s.cfg.maxMetadataValue())
	s.register(t, r, in, registryLongTTL)
	ch := s.watch(t, registryContext(t), r, service)
	registryAwait(t, ch, s.cfg.tolerance(), "set with the instance and its metadata", []kernel.Instance{in})
}

func (s registryRun) watchInitialSet(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b := s.registerTwo(t, r, service)
	ch := s.watch(t, registryContext(t), r, service)
	registryFirst(t, ch, s.cfg.tolerance(), []kernel.Instance{a, b})
}

func (s registryRun) watchInitialEmptySet(t tb) {
	r := s.open(t)
	ch := s.watch(t, registryContext(t), r, registryService(t))
	registryFirst(t, ch, s.cfg.tolerance(), nil)
}

func (s registryRun) watchAdditions(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	ch := s.watch(t, registryContext(t), r, service)
	registryAwait(t, ch, s.cfg.tolerance(), "current set", []kernel.Instance{a})
	s.register(t, r, b, registryLongTTL)
	registryAwait(t, ch, s.cfg.tolerance(), "set after registering b", []kernel.Instance{a, b})
}

func (s registryRun) watchRemovals(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	ch := s.watch(t, registryContext(t), r, service)
	registryAwait(t, ch, s.cfg.tolerance(), "current set", []kernel.Instance{a, b})
	s.deregister(t, r, a)
	registryAwait(t, ch, s.cfg.tolerance(), "set after deregistering a", []kernel.Instance{b})
	s.deregister(t, r, b)
	registryAwait(t, ch, s.cfg.tolerance(), "set after deregistering b", nil)
}

func (s registryRun) watchCancelCloses(t tb) {
	r := s.open(t)
	service := registryService(t)
	s.register(t, r, registryInstance(service, "a"), registryLongTTL)
	ctx, cancel := context.WithCancel(registryContext(t))
	ch := s.watch(t, ctx, r, service)
	cancel()
	timeout := time.NewTimer(s.cfg.tolerance())
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout.C:
			t.Fatalf("the watch channel is still open %s after its ctx was cancelled; "+
				"Watch must close it when ctx is done, or its reader never ends", s.cfg.tolerance())
		}
	}
}

func (s registryRun) sharedResolve(t tb) {
	r1, r2 := s.open(t), s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r1, a, registryLongTTL)
	s.register(t, r2, b, registryLongTTL)
	const hint = "; two registries built from the same options must share a backend"
	registryResolveUntil(t, r1, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "through the first registry, after each registered one instance"+hint)
	registryResolveUntil(t, r2, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "through the second registry, after each registered one instance"+hint)
}

func (s registryRun) sharedWatch(t tb) {
	r1, r2 := s.open(t), s.open(t)
	service := registryService(t)
	a := registryInstance(service, "a")
	ch := s.watch(t, registryContext(t), r1, service)
	registryAwait(t, ch, s.cfg.tolerance(), "current set", nil)
	s.register(t, r2, a, registryLongTTL)
	registryAwait(t, ch, s.cfg.tolerance(), "set after another registry of the same backend registered a", []kernel.Instance{a})
	s.deregister(t, r2, a)
	registryAwait(t, ch, s.cfg.tolerance(), "set after another registry of the same backend deregistered a", nil)
}

func (s registryRun) closeDeregisters(t tb) {
	closing, other := s.open(t), s.open(t)
	service := registryService(t)
	a1, a2, b := registryInstance(service, "a1"), registryInstance(service, "a2"), registryInstance(service, "b")
	s.register(t, closing, a1, registryLongTTL)
	s.register(t, closing, a2, registryLongTTL)
	s.register(t, other, b, registryLongTTL)
	registryResolveUntil(t, other, service, []kernel.Instance{a1, a2, b}, s.cfg.tolerance(), "before Close")
	if err := closing.Close(); err != nil {
		t.Fatalf("Close: %v; want nil", err)
	}
	registryResolveUntil(t, other, service, []kernel.Instance{b}, s.cfg.tolerance(),
		"after the registry that registered a1 and a2 was closed (their lease is 1m: Close must deregister them, not let them expire)")
}

// lease registers two instances under TTL: one through a registry that
// then abandons its leases, one through a registry that keeps them. The
// first must be gone within TTL+Tolerance, the second still there after it.
func (s registryRun) lease(t tb) {
	ttl, tolerance := s.cfg.ttl(), s.cfg.tolerance()
	keeper, observer := s.open(t), s.open(t)
	service := registryService(t)
	kept := registryInstance(service, "kept")
	s.register(t, keeper, kept, ttl)

	// lost is registered through a registry of its own, which then
	// abandons its leases, when the registry says it can.
	var skip string
	var abandoner kernel.LeaseAbandoner
	if caps, ok := keeper.(kernel.RegistryCapabilities); ok && !caps.HonoursTTL() {
		skip = "the registry reports HonoursTTL() == false: its instances never expire"
	} else if abandoner, ok = keeper.(kernel.LeaseAbandoner); !ok {
		skip = "the registry does not implement kernel.LeaseAbandoner, so the suite cannot stop its lease renewal " +
			"without deregistering; implement AbandonLeases to have expiry checked"
	}
	want := []kernel.Instance{kept}
	var lost kernel.Instance
	if skip == "" {
		dying := s.open(t)
		abandoner = dying.(kernel.LeaseAbandoner)
		lost = registryInstance(service, "lost")
		s.register(t, dying, lost, ttl)
		want = append(want, lost)
	}
	registryResolveUntil(t, observer, service, want, tolerance, "after registering")
	ch := s.watch(t, registryContext(t), observer, service)
	start := time.Now()
	if abandoner != nil {
		abandoner.AbandonLeases()
	}

	expired := false
	t.Run("Expires", func(t tb) {
		if skip != "" {
			t.Skipf("%s", skip)
		}
		registryResolveUntil(t, observer, service, []kernel.Instance{kept}, ttl+tolerance,
			fmt.Sprintf("after the registry of %q stopped renewing its %s lease (AbandonLeases), and nobody deregistered it", lost.ID, ttl))
		expired = true
	})
	t.Run("WatchSeesExpiry", func(t tb) {
		switch {
		case skip != "":
			t.Skipf("%s", skip)
		case !expired:
			t.Skipf("the instance never expired (see Lease/Expires)")
		}
		// Watchers must be told of expiries, not only of Deregister.
		registryAwait(t, ch, tolerance, "set after "+lost.ID+" expired", []kernel.Instance{kept})
	})
	t.Run("KeptAlive", func(t tb) {
		wait := time.NewTimer(time.Until(start.Add(ttl + tolerance)))
		defer wait.Stop()
		select {
		case <-wait.C:
		case <-t.Context().Done():
			return
		}
		set, err := observer.Resolve(registryContext(t), service)
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		if !slices.ContainsFunc(set, func(in kernel.Instance) bool { return in.ID == kept.ID }) {
			t.Errorf("instance %q, registered with a %s lease, is gone after %s = %s; the registry must renew its "+
				"leases itself until Deregister or Close", kept.ID, ttl, time.Since(start).Round(time.Millisecond), registryFormat(set))
		}
	})
}

// concurrent registers, resolves and deregisters from several goroutines
// through two registries, each instance carrying its own ID in its
// metadata, then checks the final set: every survivor there, with its own
// metadata.
func (s registryRun) concurrent(t tb) {
	const goroutines, perGoroutine = 4, 16
	regs := []kernel.Registry{s.open(t), s.open(t)}
	service := registryService(t)
	ctx := registryContext(t)
	watchCtx, stopWatching := context.WithCancel(ctx)
	var readers sync.WaitGroup
	for _, r := range regs {
		ch := s.watch(t, watchCtx, r, service)
		// The readers stop at stopWatching, not at the channel's close,
		// which is Watch/CancelCloses's business.
		registryGo(&readers, t, func() {
			for {
				select {
				case _, ok := <-ch:
					if !ok {
						return
					}
				case <-watchCtx.Done():
					return
				}
			}
		})
	}
	errs := make(chan error, goroutines)
	start := make(chan struct{}) // so that the writers overlap
	var writers sync.WaitGroup
	var mu sync.Mutex
	var survivors []kernel.Instance
	for g := range goroutines {
		r := regs[g%len(regs)]
		registryGo(&writers, t, func() {
			<-start
			for i := range perGoroutine {
				in := registryInstance(service, fmt.Sprintf("g%d-%d", g, i))
				in.Metadata = map[string]string{"id": in.ID}
				if err := r.Register(ctx, in, registryLongTTL); err != nil {
					errs <- fmt.Errorf("r.Register(%s): %w", in.ID, err)
					return
				}
				if _, err := r.Resolve(ctx, service); err != nil {
					errs <- fmt.Errorf("r.Resolve: %w", err)
					return
				}
				if i%2 == 0 {
					if err := r.Deregister(ctx, in); err != nil {
						errs <- fmt.Errorf("r.Deregister(%s): %w", in.ID, err)
						return
					}
					continue
				}
				mu.Lock()
				survivors = append(survivors, in)
				mu.Unlock()
			}
		})
	}
	close(start)
	writers.Wait()
	stopWatching()
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent use: %v", err)
	}
	registryResolveUntil(t, regs[0], service, survivors, s.cfg.tolerance(),
		fmt.Sprintf("after %d goroutines registered %d instances each (metadata id = the instance's ID) and deregistered every other one",
			goroutines, perGoroutine))
}

// registryNotUTF8 is metadata that is not UTF-8: every byte JSON and
// other text encodings replace, in a value and in a key, and a character
// cut in half.
func registryNotUTF8() map[string]string {
	var high []byte
	for c := 0x80; c <= 0xff; c++ {
		high = append(high, byte(c))
	}
	return map[string]string{
		"bytes":        string(high),
		"half":         "caf\xc3",
		"key-\xff\xfe": "a key that is not UTF-8",
		"plain":        "beside them, text",
	}
}

// metadataNotUTF8 registers an instance whose metadata is not UTF-8. The
// registry may refuse it (a backend of JSON or text cannot store it), but
// what it accepts must come back unchanged.
func (s registryRun) metadataNotUTF8(t tb) {
	r := s.open(t)
	service := registryService(t)
	in := registryInstance(service, "a")
	in.Metadata = registryNotUTF8()
	if err := r.Register(registryContext(t), in, registryLongTTL); err != nil {
		// Refused: nothing may have been registered. A registration made
		// after it shows alone.
		t.Logf("Register refused metadata that is not UTF-8: %v", err)
		marker := registryInstance(service, "marker")
		s.register(t, r, marker, registryLongTTL)
		registryResolveUntil(t, r, service, []kernel.Instance{marker}, s.cfg.tolerance(),
			"after a Register refused "+in.ID+" (its metadata is not UTF-8) and "+marker.ID+" was registered (a refused Register must register nothing)")
		return
	}
	registryResolveUntil(t, r, service, []kernel.Instance{in}, s.cfg.tolerance(),
		"after registering an instance whose metadata is not UTF-8 (store it unchanged, or have Register refuse it; never mangle it)")
}

// closeDuringFirstUse closes fresh registries while their first Resolve
// and Watch run, Close coming a little later each round: a registry that
// reads its backend or dials on first use waits there, and Close must end
// that wait.
func (s registryRun) closeDuringFirstUse(t tb) {
	tolerance := s.cfg.tolerance()
	for _, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		r := s.open(t)
		service := registryService(t)
		// The calls' ctx ends with the subtest only: what ends them must be
		// the Close.
		ctx := registryContext(t)
		wctx, cancelWatch := context.WithCancel(ctx)
		type watched struct {
			ch  <-chan []kernel.Instance
			err error
		}
		resolved, watchedCh := make(chan error, 1), make(chan watched, 1)
		var calls sync.WaitGroup
		registryGo(&calls, t, func() {
			_, err := r.Resolve(ctx, service)
			resolved <- err
		})
		registryGo(&calls, t, func() {
			ch, err := r.Watch(wctx, service)
			watchedCh <- watched{ch, err}
		})
		time.Sleep(delay)
		closed := make(chan error, 1)
		go func() { closed <- r.Close() }()
		timeout := time.NewTimer(tolerance)
		when := fmt.Sprintf("when Close came %s after the first Resolve and Watch of a fresh registry began", delay)
		var w *watched
		for pending := 3; pending > 0; pending-- {
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close %s: %v; want nil", when, err)
				}
				closed = nil
			case <-resolved:
				resolved = nil
			case got := <-watchedCh:
				w, watchedCh = &got, nil
			case <-timeout.C:
				var left []string
				if closed != nil {
					left = append(left, "Close")
				}
				if resolved != nil {
					left = append(left, "Resolve")
				}
				if watchedCh != nil {
					left = append(left, "Watch")
				}
				cancelWatch()
				t.Fatalf("%s did not return within %s %s, and their ctx was not done: Close must end the calls "+
					"waiting on the registry (a first read, a dial), not leave them to their caller's ctx",
					strings.Join(left, " and "), tolerance, when)
			}
		}
		timeout.Stop()
		calls.Wait()
		cancelWatch()
		if w != nil && w.err == nil && w.ch != nil {
			registryClosed(t, w.ch, tolerance, "the channel of a Watch that returned no error "+when+", once its ctx was cancelled,")
		}
	}
}
