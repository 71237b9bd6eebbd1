package plugintest

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Helpers the registry checks share (and the balancer checks, for
// registryGo): goroutines that report panics, fresh names, and waiting
// for, comparing and printing sets of instances.

// registryGo runs f on a goroutine of wg and turns a panic in it (in the
// plugin) into a failure of t: a panic off the subtest's own goroutine would
// end the whole test binary without naming the subtest. The balancer suite
// uses it too.
func registryGo(wg *sync.WaitGroup, t tb, f func()) {
	wg.Go(func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("panic: %v", p)
			}
		}()
		f()
	})
}

// registryContext bounds one subtest's registry calls, so that a hung
// backend fails the subtest instead of the whole test binary's timeout.
func registryContext(t tb) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// registryService names a service for one subtest: random, so that runs
// sharing a backend (one etcd cluster) never meet, and readable in the
// backend.
func registryService(t tb) string {
	return fmt.Sprintf("plugintest-%s-%08x", strings.ToLower(path.Base(t.Name())), rand.Uint32())
}

// registryInstance returns an instance of service whose Address is derived
// from id, so that an instance with a mixed-up address is noticed.
func registryInstance(service, id string) kernel.Instance {
	port := 20000
	for _, c := range id {
		port = (port*31 + int(c)) % 40000
	}
	return kernel.Instance{Service: service, ID: service + "-" + id, Address: fmt.Sprintf("127.0.0.1:%d", 20000+port)}
}

// registrySame reports whether got holds exactly want's instances, in any
// order, with the same Service, ID, Address and Metadata (nil and empty
// metadata are the same).
func registrySame(got, want []kernel.Instance) bool {
	if len(got) != len(want) {
		return false
	}
	byID := make(map[string]kernel.Instance, len(want))
	for _, in := range want {
		byID[in.ID] = in
	}
	for _, g := range got {
		w, ok := byID[g.ID]
		if !ok || g.Service != w.Service || g.Address != w.Address || !maps.Equal(g.Metadata, w.Metadata) {
			return false
		}
		delete(byID, g.ID)
	}
	return true
}

// registryFormat prints a set for a failure message, sorted by ID.
func registryFormat(set []kernel.Instance) string {
	sorted := slices.Clone(set)
	slices.SortFunc(sorted, func(a, b kernel.Instance) int { return strings.Compare(a.ID, b.ID) })
	parts := make([]string, len(sorted))
	for i, in := range sorted {
		parts[i] = fmt.Sprintf("{%s %s at %s", in.Service, in.ID, in.Address)
		if len(in.Metadata) > 0 {
			parts[i] += " metadata " + registryFormatMetadata(in.Metadata)
		}
		parts[i] += "}"
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// registryFormatMetadata prints md sorted by key, long values cut short.
func registryFormatMetadata(md map[string]string) string {
	keys := slices.Sorted(maps.Keys(md))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = strconv.Quote(k) + ":" + registryShort(md[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// registryShort quotes v, cut to its ends and its length if it is long.
func registryShort(v string) string {
	const edge = 24
	if len(v) <= 3*edge {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%q...%q (%d bytes)", v[:edge], v[len(v)-edge:], len(v))
}

// registryDiff says how got differs from want, instance by instance, for
// a failure message: a long set is hard to compare by eye.
func registryDiff(got, want []kernel.Instance) string {
	byID := make(map[string]kernel.Instance, len(got))
	for _, g := range got {
		byID[g.ID] = g
	}
	var diffs []string
	for _, w := range want {
		g, ok := byID[w.ID]
		if !ok {
			diffs = append(diffs, w.ID+" is missing")
			continue
		}
		delete(byID, w.ID)
		if g.Service != w.Service || g.Address != w.Address {
			diffs = append(diffs, fmt.Sprintf("%s is %s at %s, want %s at %s", w.ID, g.Service, g.Address, w.Service, w.Address))
		}
		for _, k := range slices.Sorted(maps.Keys(w.Metadata)) {
			if gv, ok := g.Metadata[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s lacks metadata %q", w.ID, k))
			} else if gv != w.Metadata[k] {
				diffs = append(diffs, fmt.Sprintf("%s has metadata %q = %s, want %s", w.ID, k, registryShort(gv), registryShort(w.Metadata[k])))
			}
		}
		for _, k := range slices.Sorted(maps.Keys(g.Metadata)) {
			if _, ok := w.Metadata[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s has metadata %q it was not registered with", w.ID, k))
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		diffs = append(diffs, id+" should not be there")
	}
	if len(diffs) == 0 {
		return ""
	}
	return " (" + strings.Join(diffs, "; ") + ")"
}

// registryLens is how a wait compares a set with the one wanted and
// shows it in a failure: by instances (registryByInstances), or with
// their loads too (registryByLoads). hint ends a failure's message.
type registryLens struct {
	same func(got, want []kernel.Instance) bool
	show func([]kernel.Instance) string
	hint string
}

var registryByInstances = registryLens{same: registrySame, show: registryFormat}

// registryResolveUntil resolves service through r until the set is want,
// failing t if it is not within d. Polling, not a single Resolve, so that a
// backend that takes a moment to show a change passes.
func registryResolveUntil(t tb, r kernel.Registry, service string, want []kernel.Instance, d time.Duration, when string) []kernel.Instance {
	t.Helper()
	return registryResolveBy(t, r, service, want, d, when, registryByInstances)
}

// registryResolveBy is registryResolveUntil comparing sets through lens.
func registryResolveBy(t tb, r kernel.Registry, service string, want []kernel.Instance, d time.Duration, when string, lens registryLens) []kernel.Instance {
	t.Helper()
	ctx := registryContext(t)
	deadline := time.Now().Add(d)
	for {
		// The last Resolve starts after d: one begun earlier that took
		// long may answer with what was true before d had passed.
		last := !time.Now().Before(deadline)
		set, err := r.Resolve(ctx, service)
		if err != nil {
			t.Fatalf("Resolve(%s) %s: %v; want nil", service, when, err)
		}
		if lens.same(set, want) {
			return set
		}
		if last {
			t.Fatalf("Resolve(%s) %s = %s; want %s%s (waited %s%s)", service, when, lens.show(set), lens.show(want), registryDiff(set, want), d, lens.hint)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// registryAwait reads sets from ch until one is want, failing t if none is
// within d or if ch closes. what names the set awaited, for messages.
func registryAwait(t tb, ch <-chan []kernel.Instance, d time.Duration, what string, want []kernel.Instance) []kernel.Instance {
	t.Helper()
	return registryAwaitBy(t, ch, d, what, want, registryByInstances)
}

// registryAwaitBy is registryAwait comparing sets through lens.
func registryAwaitBy(t tb, ch <-chan []kernel.Instance, d time.Duration, what string, want []kernel.Instance, lens registryLens) []kernel.Instance {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	last := "none"
	for {
		select {
		case set, open := <-ch:
			if !open {
				t.Fatalf("watch channel closed while waiting for the %s %s (last set %s); it must stay open until ctx is done",
					what, lens.show(want), last)
			}
			if lens.same(set, want) {
				return set
			}
			last = lens.show(set) + registryDiff(set, want)
		case <-timeout.C:
			t.Fatalf("watch sent no %s %s within %s; last set received: %s%s", what, lens.show(want), d, last, lens.hint)
		}
	}
}

// registryFirst checks that the first set on ch is want.
func registryFirst(t tb, ch <-chan []kernel.Instance, d time.Duration, want []kernel.Instance) {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	select {
	case set, open := <-ch:
		if !open {
			t.Fatalf("watch channel closed before sending anything; want the current set %s first", registryFormat(want))
		}
		if !registrySame(set, want) {
			t.Errorf("first watched set = %s; want the current set %s%s", registryFormat(set), registryFormat(want), registryDiff(set, want))
		}
	case <-timeout.C:
		t.Fatalf("watch sent nothing within %s; a new watcher must first be sent the current set %s, even when empty",
			d, registryFormat(want))
	}
}
