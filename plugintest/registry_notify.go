package plugintest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// notify runs the kernel.Notifier checks when the registry implements it,
// and skips them, saying why, when it does not:
//
//   - Notify/CurrentSet: Notify returns the current set, even when empty.
//   - Notify/Changes: fn is given the new set after a Register and after
//     a Deregister, including one through another registry built alike.
//   - Notify/NoOverlap: with fn slow (20ms) and changes coming faster
//     (every 2ms), calls of fn never overlap, and the last set fn is
//     given is the final one.
//   - Notify/StopEnds: once stop returns, fn is not called again, a
//     second stop returns, and every goroutine Notify started ends within
//     Tolerance.
//   - Notify/CloseEnds: once the registry is closed, fn is not called
//     again, and Notify on it fails without calling fn.
//   - Notify/KeptSets: the set Notify returned and the sets fn was given
//     are unchanged after later changes (an addition, a re-registration
//     with new metadata, a removal): the client gives each to its
//     balancer, which keeps it.
func (s registryRun) notify(t tb) {
	probe := s.open(t)
	if _, ok := probe.(kernel.Notifier); !ok {
		t.Skipf("the registry does not implement kernel.Notifier; the engine's client reads its Watch on a goroutine instead")
	}
	t.Run("CurrentSet", s.notifyCurrentSet)
	t.Run("Changes", s.notifyChanges)
	t.Run("NoOverlap", s.notifyNoOverlap)
	t.Run("StopEnds", s.notifyStopEnds)
	t.Run("CloseEnds", s.notifyCloseEnds)
	t.Run("KeptSets", s.notifyKept)
}

// notifyKept keeps the set Notify returned and each set fn was given,
// and reads them again after the later changes, which must not have
// written into them.
func (s registryRun) notifyKept(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b, c := s.keptInstances(service)
	s.register(t, r, a, registryLongTTL)
	s.register(t, r, b, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{a, b}, s.cfg.tolerance(), "after registering a and b")
	n := newNotified()
	current, _ := s.startNotify(t, r, service, n)
	kept := []registryKept{registryKeep("set Notify returned", current)}
	s.registryChanges(t, r, a, b, c, func(what string, want []kernel.Instance) {
		kept = append(kept, registryKeep(what+" (given to fn)", registryAwait(t, n.sets, s.cfg.tolerance(), what, want)))
	})
	registryCheckKept(t, kept, "after fn was given later sets")
}

// notified records what a Notify gives its fn.
type notified struct {
	sets    chan []kernel.Instance            // every set, for registryAwait
	last    atomic.Pointer[[]kernel.Instance] // the set of fn's latest call
	calls   atomic.Int64
	running atomic.Int64
	overlap atomic.Bool
	delay   time.Duration // how long fn takes
}

func newNotified() *notified { return &notified{sets: make(chan []kernel.Instance, 1024)} }

func (n *notified) fn(set []kernel.Instance) {
	if n.running.Add(1) > 1 {
		n.overlap.Store(true)
	}
	defer n.running.Add(-1)
	n.calls.Add(1)
	n.last.Store(&set)
	time.Sleep(n.delay)
	select {
	case n.sets <- set:
	default: // more sets than any check awaits
	}
}

// start calls Notify with n's fn and stops it when t ends.
func (s registryRun) startNotify(t tb, r kernel.Registry, service string, n *notified) (current []kernel.Instance, stop func()) {
	t.Helper()
	current, stop, err := r.(kernel.Notifier).Notify(registryContext(t), service, n.fn)
	if err != nil {
		t.Fatalf("Notify(%s): %v; want nil", service, err)
	}
	if stop == nil {
		t.Fatalf("Notify(%s) returned a nil stop", service)
	}
	t.Cleanup(stop)
	return current, stop
}

func (s registryRun) notifyCurrentSet(t tb) {
	r := s.open(t)
	service := registryService(t)
	if current, _ := s.startNotify(t, r, service, newNotified()); len(current) != 0 {
		t.Errorf("Notify(%s) before any Register returned %s; want the empty set", service, registryFormat(current))
	}
	a, b := s.registerTwo(t, r, service)
	if current, _ := s.startNotify(t, r, service, newNotified()); !registrySame(current, []kernel.Instance{a, b}) {
		t.Errorf("Notify(%s) returned %s; want the current set %s%s", service,
			registryFormat(current), registryFormat([]kernel.Instance{a, b}), registryDiff(current, []kernel.Instance{a, b}))
	}
}

func (s registryRun) notifyChanges(t tb) {
	r, other := s.open(t), s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	s.register(t, r, a, registryLongTTL)
	registryResolveUntil(t, r, service, []kernel.Instance{a}, s.cfg.tolerance(), "after registering a")
	n := newNotified()
	s.startNotify(t, r, service, n)
	s.register(t, other, b, registryLongTTL)
	registryAwait(t, n.sets, s.cfg.tolerance(), "set after another registry registered b", []kernel.Instance{a, b})
	s.deregister(t, r, a)
	registryAwait(t, n.sets, s.cfg.tolerance(), "set after deregistering a", []kernel.Instance{b})
}

func (s registryRun) notifyNoOverlap(t tb) {
	r := s.open(t)
	service := registryService(t)
	n := newNotified()
	n.delay = 20 * time.Millisecond
	s.startNotify(t, r, service, n)
	// Changes come every 2ms, while fn takes 20: a registry that does not
	// hold the next call back until fn has returned overlaps them.
	want := make([]kernel.Instance, 8)
	for i := range want {
		want[i] = registryInstance(service, string(rune('a'+i)))
		s.register(t, r, want[i], registryLongTTL)
		time.Sleep(2 * time.Millisecond)
	}
	registryAwait(t, n.sets, s.cfg.tolerance()+time.Duration(len(want))*n.delay, "set with all 8 registered", want)
	// The final set must be the last one fn is given: a set handed over
	// after it is stale, and the client would keep calling it. Wait until
	// fn has been quiet for a while, then read what it was given last.
	// A registry that calls fn again and again (a periodic refresh) is
	// read once Tolerance has passed.
	for calls, deadline := n.calls.Load(), time.Now().Add(s.cfg.tolerance()); time.Now().Before(deadline); {
		time.Sleep(5 * n.delay)
		now := n.calls.Load()
		if now == calls && n.running.Load() == 0 {
			break
		}
		calls = now
	}
	if last := *n.last.Load(); !registrySame(last, want) {
		t.Errorf("after the set with all 8 registered, fn was last given %s; want the final set %s%s: "+
			"a set handed over after a later one must not be", registryFormat(last), registryFormat(want), registryDiff(last, want))
	}
	if n.overlap.Load() {
		t.Errorf("fn was called while an earlier call of it still ran; calls must not overlap")
	}
}

func (s registryRun) notifyStopEnds(t tb) {
	r := s.open(t)
	service := registryService(t)
	a, b := registryInstance(service, "a"), registryInstance(service, "b")
	// Registered from goroutines that end at once, so that what a
	// Register starts for its lease is not counted as Notify's.
	s.registerApart(t, r, a)
	tree := newGoroutineTree()
	n := newNotified()
	_, stop := s.startNotify(t, r, service, n)
	s.registerApart(t, r, b)
	registryAwait(t, n.sets, s.cfg.tolerance(), "set after registering b", []kernel.Instance{a, b})
	tree.snapshot()
	stop()
	calls := n.calls.Load()
	stop()
	s.deregister(t, r, b)
	registryResolveUntil(t, r, service, []kernel.Instance{a}, s.cfg.tolerance(), "after deregistering b")
	if left := tree.await(s.cfg.tolerance()); len(left) > 0 {
		t.Errorf("%d goroutines Notify started still run %s after stop (the registry is still open):\n%s",
			len(left), s.cfg.tolerance(), registryStacks(left))
	}
	if later := n.calls.Load() - calls; later > 0 {
		t.Errorf("fn was called %d times after stop returned; want none", later)
	}
}

// registerApart registers in through r from a goroutine that has ended
// when it returns.
func (s registryRun) registerApart(t tb, r kernel.Registry, in kernel.Instance) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Register(registryContext(t), in, registryLongTTL) }()
	if err := <-done; err != nil {
		t.Fatalf("Register(%s/%s): %v; want nil", in.Service, in.ID, err)
	}
}

func (s registryRun) notifyCloseEnds(t tb) {
	r, other := s.open(t), s.open(t)
	service := registryService(t)
	n := newNotified()
	s.startNotify(t, r, service, n)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v; want nil", err)
	}
	calls := n.calls.Load()
	s.register(t, other, registryInstance(service, "a"), registryLongTTL)
	registryResolveUntil(t, other, service, []kernel.Instance{registryInstance(service, "a")}, s.cfg.tolerance(), "after registering a")
	time.Sleep(min(s.cfg.tolerance(), 200*time.Millisecond))
	if later := n.calls.Load() - calls; later > 0 {
		t.Errorf("fn was called %d times after its registry was closed; want none", later)
	}
	late := newNotified()
	if _, stop, err := r.(kernel.Notifier).Notify(context.Background(), service, late.fn); err == nil {
		t.Errorf("Notify after Close: nil error; want one saying the registry is closed")
		if stop != nil {
			stop()
		}
	}
	if late.calls.Load() > 0 {
		t.Errorf("Notify after Close called fn; want no call")
	}
}
