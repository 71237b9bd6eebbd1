package plugintest

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registryRecord runs the suite under a recorder on registries f builds
// in a namespace of their own, with a short lease. tolerance is short for
// broken registries, whose runs wait out every bound they fail, and
// generous where a failure would be a false positive.
func registryRecord(t *testing.T, namespace string, f kernel.Factory[kernel.Registry], tolerance time.Duration) *recording {
	t.Helper()
	cfg := RegistryConfig{
		Options:   map[string]any{"namespace": "plugintest-" + namespace},
		TTL:       300 * time.Millisecond,
		Tolerance: tolerance,
	}
	return record(t, "Registry", func(t tb) { registrySuite(t, f, cfg) })
}

// registryCatches runs the suite on each broken registry at once (their
// runs mostly wait), then checks in a subtest per registry that the suite
// failed the subtests at its paths.
func registryCatches(t *testing.T, cases []registryBrokenCase) {
	t.Helper()
	recs := make([]*recording, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Go(func() { recs[i] = registryRecord(t, t.Name()+"/"+tc.name, tc.f, 500*time.Millisecond) })
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range tc.caught {
				expectCaught(t, recs[i], path)
			}
			for _, said := range tc.says {
				expectMessage(t, recs[i], said[0], said[1])
			}
		})
	}
}

type registryBrokenCase struct {
	name   string
	f      kernel.Factory[kernel.Registry]
	caught []string    // the subtests that must fail
	says   [][2]string // a path of caught, and words its complaint must hold
}

// registryBroken is a factory of memory registries, each changed by wrap.
func registryBroken(wrap func(r *memory.Registry) kernel.Registry) kernel.Factory[kernel.Registry] {
	return kernel.NewFactory("broken-memory", "a memory registry with one defect", memory.DefaultOptions,
		func(o *memory.Options) (kernel.Registry, error) {
			r, err := memory.New(*o)
			if err != nil {
				return nil, err
			}
			return wrap(r), nil
		})
}

func TestRegistryMemoryPasses(t *testing.T) {
	t.Parallel()
	rec := registryRecord(t, t.Name(), memory.Factory, 2*time.Second)
	for _, f := range rec.failures {
		t.Errorf("the good memory registry failed %s: %s", f.path, f.msg)
	}
	for _, s := range rec.skips {
		if s.path == "Registry/Elector" {
			continue // memory runs no elections: TestRegistryElectorPasses
		}
		t.Errorf("the memory registry, which has every capability, had %s skipped: %s", s.path, s.msg)
	}
}

// TestRegistryCatchesBrokenPlugins runs the suite on memory registries with
// one defect each and checks that the subtest for that property fails.
func TestRegistryCatchesBrokenPlugins(t *testing.T) {
	t.Parallel()
	broken := func(wrap func(*memory.Registry) kernel.Registry) kernel.Factory[kernel.Registry] {
		return registryBroken(wrap)
	}
	watchEdit := func(keep func(n int, prev, set []kernel.Instance) bool, leaveOpen bool) kernel.Factory[kernel.Registry] {
		return registryBroken(func(r *memory.Registry) kernel.Registry { return registryWatchEdit{r, keep, leaveOpen} })
	}

	// Each registry gets a namespace of its own, whatever the options say:
	// two registries built alike do not share a backend.
	var builds atomic.Int64
	separate := kernel.NewFactory("broken-memory", "a memory registry that shares nothing", memory.DefaultOptions,
		func(o *memory.Options) (kernel.Registry, error) {
			o.Namespace += "-" + strconv.FormatInt(builds.Add(1), 10)
			return memory.New(*o)
		})

	// Registrations go through a second registry that Close forgets.
	closeLeaves := registryShadowed(t, func(r, shadow *memory.Registry) kernel.Registry { return registryCloseLeaves{r, shadow} })

	cases := append(registryBoundaryCases(), registryEndingCases(t)...)
	cases = append(cases, registrySetCases()...)
	registryCatches(t, append(cases, []registryBrokenCase{
		{name: "ErrorForUnknownService", f: broken(func(r *memory.Registry) kernel.Registry { return registryErrUnknown{r} }),
			caught: []string{"Registry/Resolve/UnknownService"}},
		{name: "PlaceholderForUnknownService", f: broken(func(r *memory.Registry) kernel.Registry { return registryPlaceholder{r} }),
			caught: []string{"Registry/Resolve/UnknownService"}},
		{name: "ResolveCachesFirstSet", f: broken(func(r *memory.Registry) kernel.Registry { return &registryStaleResolve{Registry: r} }),
			caught: []string{"Registry/Register/Visible"}},
		{name: "DeregisterDoesNothing", f: broken(func(r *memory.Registry) kernel.Registry { return registryNoDeregister{r} }),
			caught: []string{"Registry/Deregister/Removes"}},
		{name: "InstancesKeptByIDAlone", f: broken(func(r *memory.Registry) kernel.Registry {
			return &registryIDOnly{Registry: r, byID: make(map[string]kernel.Instance)}
		}), caught: []string{"Registry/Deregister/ByServiceAndID"}},
		{name: "ResolveDropsMetadata", f: broken(func(r *memory.Registry) kernel.Registry { return registryResolveNoMetadata{r} }),
			caught: []string{"Registry/Metadata/Resolve"}},
		{name: "WatchDropsMetadata", f: watchEdit(func(n int, prev, set []kernel.Instance) bool {
			for i := range set {
				set[i].Metadata = nil
			}
			return true
		}, false), caught: []string{"Registry/Metadata/Watch"}},
		{name: "WatchSkipsInitialSet", f: watchEdit(func(n int, prev, set []kernel.Instance) bool { return n > 0 }, false),
			caught: []string{"Registry/Watch/InitialSet", "Registry/Watch/InitialEmptySet"}},
		{name: "WatchMissesAdditions", f: watchEdit(func(n int, prev, set []kernel.Instance) bool { return n == 0 || len(set) <= len(prev) }, false),
			caught: []string{"Registry/Watch/Additions"}},
		{name: "WatchMissesRemovals", f: watchEdit(func(n int, prev, set []kernel.Instance) bool { return n == 0 || len(set) >= len(prev) }, false),
			caught: []string{"Registry/Watch/Removals", "Registry/Lease/WatchSeesExpiry"}},
		{name: "WatchNeverCloses", f: watchEdit(func(int, []kernel.Instance, []kernel.Instance) bool { return true }, true),
			caught: []string{"Registry/Watch/CancelCloses"}},
		{name: "SeparateNamespaces", f: separate, caught: []string{"Registry/Shared/Resolve", "Registry/Shared/Watch"}},
		{name: "CloseLeavesInstances", f: closeLeaves, caught: []string{"Registry/Close/Deregisters"}},
		{name: "LeaseNeverExpires", f: broken(func(r *memory.Registry) kernel.Registry { return registryNeverExpires{r} }),
			caught: []string{"Registry/Lease/Expires"}},
		{name: "LeaseNeverRenewed", f: broken(func(r *memory.Registry) kernel.Registry { r.AbandonLeases(); return r }),
			caught: []string{"Registry/Lease/KeptAlive"}},
		{name: "NotifyMissesChanges", f: broken(func(r *memory.Registry) kernel.Registry { return registryNotifyEdit{r, notifyDrops} }),
			caught: []string{"Registry/Notify/Changes", "Registry/Notify/NoOverlap"}},
		{name: "NotifyOverlaps", f: broken(func(r *memory.Registry) kernel.Registry { return registryNotifyEdit{r, notifyOverlaps} }),
			caught: []string{"Registry/Notify/NoOverlap"}},
		{name: "NotifyStopDoesNothing", f: broken(func(r *memory.Registry) kernel.Registry { return registryNotifyEdit{r, notifyStopIgnored} }),
			caught: []string{"Registry/Notify/StopEnds"}},
		{name: "ConcurrentRegistersShareScratch", f: broken(func(r *memory.Registry) kernel.Registry {
			return &registryScratchMetadata{Registry: r, scratch: make(map[string]string)}
		}), caught: []string{"Registry/Concurrent"}},
	}...))
}

// TestRegistrySkipsWhatIsNotDeclared checks that the lease expiry checks
// are skipped, with the reason, for a registry that declares it does not
// expire entries or that cannot be made to stop renewing them.
func TestRegistrySkipsWhatIsNotDeclared(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		wrap func(*memory.Registry) kernel.Registry
		why  string
	}{
		{"NoTTL", func(r *memory.Registry) kernel.Registry { return registryNoTTL{r} }, "HonoursTTL"},
		// Only the kernel.Registry methods: no AbandonLeases.
		{"NoLeaseAbandoner", func(r *memory.Registry) kernel.Registry { return struct{ kernel.Registry }{r} }, "LeaseAbandoner"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := registryRecord(t, t.Name(), registryBroken(tc.wrap), 2*time.Second)
			for _, path := range []string{"Registry/Lease/Expires", "Registry/Lease/WatchSeesExpiry"} {
				if why := rec.skippedUnder(path); !strings.Contains(why, tc.why) {
					t.Errorf("%s: skip reason %q; want one naming %s", path, why, tc.why)
				}
			}
			for _, f := range rec.failures {
				t.Errorf("a registry that only lacks a capability failed %s: %s", f.path, f.msg)
			}
		})
	}
}

type registryErrUnknown struct{ *memory.Registry }

func (r registryErrUnknown) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	set, err := r.Registry.Resolve(ctx, service)
	if err == nil && len(set) == 0 {
		return nil, errors.New("broken: no such service")
	}
	return set, err
}

// registryStaleResolve serves every service's first resolved set forever.
// registryPlaceholder lists a placeholder instance for a service nobody
// registered, as a registry backed by DNS might list a default address.
type registryPlaceholder struct{ *memory.Registry }

func (r registryPlaceholder) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	set, err := r.Registry.Resolve(ctx, service)
	if err == nil && len(set) == 0 {
		return []kernel.Instance{{Service: service, ID: "placeholder", Address: "127.0.0.1:1"}}, nil
	}
	return set, err
}

type registryStaleResolve struct {
	*memory.Registry
	mu    sync.Mutex
	cache map[string][]kernel.Instance
}

func (r *registryStaleResolve) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set, ok := r.cache[service]; ok {
		return set, nil
	}
	set, err := r.Registry.Resolve(ctx, service)
	if err == nil {
		if r.cache == nil {
			r.cache = make(map[string][]kernel.Instance)
		}
		r.cache[service] = set
	}
	return set, err
}

type registryNoDeregister struct{ *memory.Registry }

func (registryNoDeregister) Deregister(context.Context, kernel.Instance) error { return nil }

// registryIDOnly keeps instances by ID alone, as a registry keyed by a
// backend's global service ID would: an instance of another service with
// the same ID replaces one, and deregistering it removes the other.
type registryIDOnly struct {
	*memory.Registry
	mu   sync.Mutex
	byID map[string]kernel.Instance
}

func (r *registryIDOnly) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	r.mu.Lock()
	prev, ok := r.byID[inst.ID]
	r.byID[inst.ID] = inst
	r.mu.Unlock()
	if ok && prev.Service != inst.Service {
		_ = r.Registry.Deregister(ctx, prev)
	}
	return r.Registry.Register(ctx, inst, ttl)
}

func (r *registryIDOnly) Deregister(ctx context.Context, inst kernel.Instance) error {
	r.mu.Lock()
	prev, ok := r.byID[inst.ID]
	delete(r.byID, inst.ID)
	r.mu.Unlock()
	if ok {
		inst = prev
	}
	return r.Registry.Deregister(ctx, inst)
}

type registryResolveNoMetadata struct{ *memory.Registry }

func (r registryResolveNoMetadata) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	set, err := r.Registry.Resolve(ctx, service)
	for i := range set {
		set[i].Metadata = nil
	}
	return set, err
}

// registryWatchEdit relays the memory registry's watch through keep, which
// may change the n-th set and says whether to pass it on (prev is the last
// set passed on); with leaveOpen it never closes the channel.
type registryWatchEdit struct {
	*memory.Registry
	keep      func(n int, prev, set []kernel.Instance) bool
	leaveOpen bool
}

func (r registryWatchEdit) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	in, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	out := make(chan []kernel.Instance)
	go func() {
		if !r.leaveOpen {
			defer close(out)
		}
		var prev []kernel.Instance
		n := 0
		for set := range in {
			if r.keep(n, prev, set) {
				prev = set
				select {
				case out <- set:
				case <-ctx.Done():
				}
			}
			n++
		}
	}()
	return out, nil
}

type registryNeverExpires struct{ *memory.Registry }

func (registryNeverExpires) AbandonLeases() {}

// registryScratchMetadata copies each registration's metadata through one
// scratch map, which concurrent Registers overwrite for each other.
type registryScratchMetadata struct {
	*memory.Registry
	mu      sync.Mutex
	scratch map[string]string
}

func (r *registryScratchMetadata) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	r.mu.Lock()
	clear(r.scratch)
	maps.Copy(r.scratch, inst.Metadata)
	r.mu.Unlock()
	time.Sleep(time.Millisecond) // widen the window, as a loaded machine does
	r.mu.Lock()
	inst.Metadata = maps.Clone(r.scratch)
	r.mu.Unlock()
	return r.Registry.Register(ctx, inst, ttl)
}

// registryCloseLeaves registers through shadow, which its Close leaves
// open.
type registryCloseLeaves struct {
	*memory.Registry
	shadow *memory.Registry
}

func (r registryCloseLeaves) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	return r.shadow.Register(ctx, inst, ttl)
}

func (r registryCloseLeaves) Deregister(ctx context.Context, inst kernel.Instance) error {
	return r.shadow.Deregister(ctx, inst)
}

type registryNoTTL struct{ *memory.Registry }

func (registryNoTTL) HonoursTTL() bool { return false }

// registryNotifyEdit breaks the memory registry's Notify one way.
type registryNotifyEdit struct {
	*memory.Registry
	defect notifyDefect
}

type notifyDefect int

const (
	notifyDrops       notifyDefect = iota // fn is never called
	notifyOverlaps                        // each set goes to fn on a goroutine of its own
	notifyStopIgnored                     // stop returns without ending anything
)

func (r registryNotifyEdit) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	relay := fn
	switch r.defect {
	case notifyDrops:
		relay = func([]kernel.Instance) {}
	case notifyOverlaps:
		relay = func(set []kernel.Instance) { go fn(set) }
	}
	current, stop, err := r.Registry.Notify(ctx, service, relay)
	if err == nil && r.defect == notifyStopIgnored {
		stop = func() {}
	}
	return current, stop, err
}

// staleReplayingNotifier hands fn each set, then the set before it once
// more: calls never overlap, every set arrives, but the last set fn is
// given is a stale one, as a notifier that starts a goroutine per change
// and serialises fn with a mutex gives when the goroutines run out of
// order. A client fed by it keeps calling a set that is no longer current.
type staleReplayingNotifier struct{ *memory.Registry }

func (r staleReplayingNotifier) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	var mu sync.Mutex
	var prev []kernel.Instance
	var havePrev bool
	current, stop, err := r.Registry.Notify(ctx, service, func(set []kernel.Instance) {
		mu.Lock()
		defer mu.Unlock()
		fn(set)
		if havePrev {
			fn(prev)
		}
		prev, havePrev = set, true
	})
	if err == nil {
		mu.Lock()
		prev, havePrev = current, true
		mu.Unlock()
	}
	return current, stop, err
}

// The last set fn is given must be the final one.
func TestNotifierGivingAStaleLastSetIsCaught(t *testing.T) {
	f := registryBroken(func(r *memory.Registry) kernel.Registry { return staleReplayingNotifier{r} })
	rec := registryRecord(t, t.Name(), f, 500*time.Millisecond)
	expectCaught(t, rec, "Registry/Notify/NoOverlap")
}
