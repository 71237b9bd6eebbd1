package plugintest

import (
	"maps"
	"slices"

	"github.com/kernrpc/kernrpc/kernel"
)

// registryKept is a set as received, and a copy of it made then.
type registryKept struct {
	what      string
	set, copy []kernel.Instance
}

func registryKeep(what string, set []kernel.Instance) registryKept {
	c := slices.Clone(set)
	for i := range c {
		c[i].Metadata = maps.Clone(c[i].Metadata)
	}
	return registryKept{what, set, c}
}

// check fails t for each kept set that changed since it was received.
func registryCheckKept(t tb, kept []registryKept, after string) {
	t.Helper()
	for _, k := range kept {
		if !registrySame(k.set, k.copy) || len(k.set) != len(k.copy) {
			t.Errorf("the %s was %s when received, and is %s %s%s; a registry must not write into slices or maps it has handed out "+
				"(the client gives them to its balancer, which keeps them): build each set afresh",
				k.what, registryFormat(k.copy), registryFormat(k.set), after, registryDiff(k.set, k.copy))
		}
	}
}

// registryChanges are the changes the Kept subtests make after keeping a
// set: an addition, a re-registration with new metadata and a removal.
func (s registryRun) registryChanges(t tb, r kernel.Registry, a, b, c kernel.Instance, step func(what string, want []kernel.Instance)) {
	s.register(t, r, c, registryLongTTL)
	step("set after registering c", []kernel.Instance{a, b, c})
	a2 := a
	a2.Metadata = map[string]string{"zone": "moved", "version": "2"}
	s.register(t, r, a2, registryLongTTL)
	step("set after registering a again with new metadata", []kernel.Instance{a2, b, c})
	s.deregister(t, r, b)
	step("set after deregistering b", []kernel.Instance{a2, c})
}

func (s registryRun) keptInstances(service string) (a, b, c kernel.Instance) {
	a, b, c = registryInstance(service, "a"), registryInstance(service, "b"), registryInstance(service, "c")
	a.Metadata = map[string]string{"zone": "first"}
	b.Metadata = map[string]string{"zone": "second"}
	return a, b, c
}

func (s registryRun) keptResolve(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b, c := s.keptInstances(service)
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	kept := []registryKept{registryKeep("set Resolve returned first",
		registryResolveUntil(t, r, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "after registering a and b"))}
	s.registryChanges(t, r, a, b, c, func(what string, want []kernel.Instance) {
		kept = append(kept, registryKeep(what+" (Resolve)", registryResolveUntil(t, r, service, want, s.cfg.tolerance(), what)))
	})
	registryCheckKept(t, kept, "after the later changes")
}

func (s registryRun) keptWatch(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b, c := s.keptInstances(service)
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	ch := s.watch(t, registryContext(t), r, service)
	kept := []registryKept{registryKeep("first watched set", registryAwait(t, ch, s.cfg.tolerance(), "current set", []kernel.Instance{a, b}))}
	s.registryChanges(t, r, a, b, c, func(what string, want []kernel.Instance) {
		kept = append(kept, registryKeep("watched "+what, registryAwait(t, ch, s.cfg.tolerance(), what, want)))
	})
	registryCheckKept(t, kept, "after the watcher was sent later sets")
}

// watchSequence follows one watcher through a run of changes made by two
// registries, each awaited before the next is made.
func (s registryRun) watchSequence(t tb) {
	r1, r2 := s.open(t), s.open(t)
	service := registryService(t)
	tolerance := s.cfg.tolerance()
	ch := s.watch(t, registryContext(t), r1, service)
	registryAwait(t, ch, tolerance, "current set", nil)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r1, a, registryLongTTL)
	registryAwait(t, ch, tolerance, "set after registering a", []kernel.Instance{a})
	s.register(t, r2, b, registryLongTTL)
	registryAwait(t, ch, tolerance, "set after another registry registered b", []kernel.Instance{a, b})
	a.Metadata = map[string]string{"version": "2"}
	s.register(t, r1, a, registryLongTTL)
	registryAwait(t, ch, tolerance, "set after registering a again with new metadata (the IDs did not change, an instance did)",
		[]kernel.Instance{a, b})
	a.Address = "127.0.0.1:1" // restarted on another port, under the same ID
	s.register(t, r1, a, registryLongTTL)
	registryAwait(t, ch, tolerance, "set after registering a again with a new address", []kernel.Instance{a, b})
	s.deregister(t, r2, b)
	registryAwait(t, ch, tolerance, "set after deregistering b", []kernel.Instance{a})
	b.Metadata = map[string]string{"weight": "5"}
	s.register(t, r2, b, registryLongTTL)
	registryAwait(t, ch, tolerance, "set after registering b back, with metadata", []kernel.Instance{a, b})
	s.deregister(t, r1, a)
	registryAwait(t, ch, tolerance, "set after deregistering a", []kernel.Instance{b})
	if err := r2.Close(); err != nil {
		t.Fatalf("Close: %v; want nil", err)
	}
	registryAwait(t, ch, tolerance, "set after the registry that registered b was closed", nil)
}
