package plugintest

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// load runs the kernel.LoadReporter checks when the registry implements
// it, and skips them, saying why, when it does not:
//
//   - Load/Resolve: a load reported for an instance the registry
//     registered shows, whole (InFlight, QPS, Updated), as that instance's
//     Load in what another registry built alike resolves, and no other
//     instance's, and its metadata is untouched; a second report, made at
//     once, replaces it (a registry that holds reports back for an
//     interval writes the latest of them).
//   - Load/Watch: a watcher is sent the set again when a load is reported,
//     with the new Load: load-aware balancers are fed by Watch.
//   - Load/NotRegistered: a report for an instance never registered, and
//     for one deregistered, fails and registers nothing: a load report
//     is not a lease.
//
// A registry that holds reports back must show one within Tolerance:
// give its Options a short interval.
func (s registryRun) load(t tb) {
	probe := s.open(t)
	if _, ok := probe.(kernel.LoadReporter); !ok {
		t.Skipf("the registry does not implement kernel.LoadReporter; servers publish no load through it, and load-aware balancers see none")
	}
	t.Run("Resolve", s.loadResolve)
	t.Run("Watch", s.loadWatch)
	t.Run("NotRegistered", s.loadNotRegistered)
}

// registryLoads are loads to report: whole milliseconds, so that a
// registry storing Updated to the millisecond returns it exactly; one
// with no calls in flight, and fractional rates.
func registryLoads() (first, second, third kernel.Load) {
	at := time.UnixMilli(time.Now().UnixMilli())
	return kernel.Load{InFlight: 7, QPS: 12.5, Updated: at},
		kernel.Load{InFlight: 0, QPS: 0.25, Updated: at.Add(1500 * time.Millisecond)},
		kernel.Load{InFlight: 31, QPS: 1234.0625, Updated: at.Add(2 * time.Second)}
}

func (s registryRun) reportLoad(t tb, r kernel.Registry, in kernel.Instance, load kernel.Load) {
	t.Helper()
	if err := r.(kernel.LoadReporter).ReportLoad(registryContext(t), in, load); err != nil {
		t.Fatalf("ReportLoad(%s/%s, %s): %v; want nil for an instance this registry registered", in.Service, in.ID, registryFormatLoad(load), err)
	}
}

// registrySameLoads is registrySame that also compares each instance's
// Load.
func registrySameLoads(got, want []kernel.Instance) bool {
	if !registrySame(got, want) {
		return false
	}
	for _, g := range got {
		i := slices.IndexFunc(want, func(w kernel.Instance) bool { return w.ID == g.ID })
		if !registrySameLoad(g.Load, want[i].Load) {
			return false
		}
	}
	return true
}

func registrySameLoad(a, b kernel.Load) bool {
	return a.InFlight == b.InFlight && a.QPS == b.QPS && a.Updated.Equal(b.Updated)
}

func registryFormatLoad(l kernel.Load) string {
	if l == (kernel.Load{}) {
		return "no load"
	}
	return fmt.Sprintf("{InFlight %d, QPS %g, Updated %s}", l.InFlight, l.QPS, l.Updated.UTC().Format(time.RFC3339Nano))
}

// registryFormatLoads prints each instance's ID and Load.
func registryFormatLoads(set []kernel.Instance) string {
	parts := make([]string, len(set))
	for i, in := range set {
		parts[i] = in.ID + ": " + registryFormatLoad(in.Load)
	}
	slices.Sort(parts)
	return "[" + strings.Join(parts, "; ") + "]"
}

// registryByLoads compares sets with their loads. A load that does not
// show in Resolve within Tolerance is most likely held back: the hint says
// what to do; one that Watch does not send is a change of the set missed.
var registryByLoads = registryLens{
	same: registrySameLoads,
	show: func(set []kernel.Instance) string {
		return registryFormat(set) + " with loads " + registryFormatLoads(set)
	},
	hint: "; a registry that holds reports back must write the latest within Tolerance (give its Options a short interval), " +
		"and a reported load is a change of the set, which watchers, feeding load-aware balancers, must be sent",
}

func (s registryRun) loadResolve(t tb) {
	r, observer := s.open(t), s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	a.Metadata = map[string]string{"weight": "3", "zone": "eu"}
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	registryResolveUntil(t, observer, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "after registering a and b")
	first, second, third := registryLoads()
	s.reportLoad(t, r, a, first)
	a.Load = first
	registryResolveBy(t, observer, service, []kernel.Instance{a, b}, s.cfg.tolerance(),
		"through another registry, after a's load was reported (b's never was)", registryByLoads)
	s.reportLoad(t, r, a, second)
	s.reportLoad(t, r, b, third)
	a.Load, b.Load = second, third
	registryResolveBy(t, observer, service, []kernel.Instance{a, b}, s.cfg.tolerance(),
		"through another registry, after a's load was reported again at once, and b's", registryByLoads)
	registryResolveBy(t, r, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "through the registry that reported them", registryByLoads)
}

func (s registryRun) loadWatch(t tb) {
	r, observer := s.open(t), s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	ch := s.watch(t, registryContext(t), observer, service)
	registryAwait(t, ch, s.cfg.tolerance(), "current set", []kernel.Instance{a, b})
	first, second, _ := registryLoads()
	s.reportLoad(t, r, b, first)
	b.Load = first
	registryAwaitBy(t, ch, s.cfg.tolerance(), "set after b's load was reported", []kernel.Instance{a, b}, registryByLoads)
	s.reportLoad(t, r, b, second)
	b.Load = second
	registryAwaitBy(t, ch, s.cfg.tolerance(), "set after b's load was reported again", []kernel.Instance{a, b}, registryByLoads)
}

func (s registryRun) loadNotRegistered(t tb) {
	r := s.open(t)
	lr := r.(kernel.LoadReporter)
	service := registryService(t)
	first, second, third := registryLoads()
	never := registryInstance(service, "never")
	if err := lr.ReportLoad(registryContext(t), never, first); err == nil {
		t.Errorf("ReportLoad of an instance nobody registered: nil error; want one saying it is not registered")
	}
	gone := registryInstance(service, "gone")
	s.register(t, r, gone, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{gone}, s.cfg.tolerance(),
		"after reporting the load of "+never.ID+", which nobody registered, and registering "+gone.ID+
			" (a load report must not register an instance)")
	// Two reports at once: a registry that holds the second back for an
	// interval must drop it with the instance, not write it afterwards.
	s.reportLoad(t, r, gone, first)
	s.reportLoad(t, r, gone, second)
	s.deregister(t, r, gone)
	if err := lr.ReportLoad(registryContext(t), gone, third); err == nil {
		t.Errorf("ReportLoad of an instance deregistered: nil error; want one saying it is not registered")
	}
	// A registration made after the reports shows once they would have:
	// neither may have brought an instance (back).
	time.Sleep(min(s.cfg.tolerance()/4, 250*time.Millisecond))
	marker := registryInstance(service, "marker")
	s.register(t, r, marker, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{marker}, s.cfg.tolerance(),
		"after reporting the load of "+never.ID+", never registered, and of "+gone.ID+", twice before and once after its Deregister, "+
			"then registering "+marker.ID+" (a load report must not register an instance, nor bring one back)")
}
