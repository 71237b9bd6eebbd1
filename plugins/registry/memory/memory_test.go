package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open builds a memory registry the way a config does, in a namespace of its
// own unless options say otherwise, and closes it when the test ends.
func open(t *testing.T, options map[string]any) *Registry {
	t.Helper()
	opts := map[string]any{"namespace": t.Name()}
	for k, v := range options {
		opts[k] = v
	}
	reg, err := kernel.NewRegistry(Name, opts, "test.yaml")
	if err != nil {
		t.Fatalf("NewRegistry(%q, %v): %v", Name, opts, err)
	}
	r := reg.(*Registry)
	t.Cleanup(func() { r.Close() })
	return r
}

func inst(service, id string) kernel.Instance {
	return kernel.Instance{Service: service, ID: id, Address: "addr-of-" + id}
}

func ids(set []kernel.Instance) []string {
	out := make([]string, len(set))
	for i, in := range set {
		out[i] = in.ID
	}
	return out
}

func resolveIDs(t *testing.T, r *Registry, service string) []string {
	t.Helper()
	set, err := r.Resolve(context.Background(), service)
	if err != nil {
		t.Fatalf("Resolve(%q): %v", service, err)
	}
	return ids(set)
}

func mustRegister(t *testing.T, r *Registry, in kernel.Instance, ttl time.Duration) {
	t.Helper()
	if err := r.Register(context.Background(), in, ttl); err != nil {
		t.Fatalf("Register(%s/%s): %v", in.Service, in.ID, err)
	}
}

// receive waits for the next set on ch.
func receive(t *testing.T, ch <-chan []kernel.Instance, within time.Duration) []kernel.Instance {
	t.Helper()
	select {
	case set, ok := <-ch:
		if !ok {
			t.Fatalf("watch channel closed, want a set")
		}
		return set
	case <-time.After(within):
		t.Fatalf("no set within %s", within)
		return nil
	}
}

// receiveUntil reads sets until one has exactly want's IDs.
func receiveUntil(t *testing.T, ch <-chan []kernel.Instance, want []string, within time.Duration) []kernel.Instance {
	t.Helper()
	deadline := time.After(within)
	var last []string
	for {
		select {
		case set, ok := <-ch:
			if !ok {
				t.Fatalf("watch channel closed while waiting for %v (last set %v)", want, last)
			}
			last = ids(set)
			if slices.Equal(last, want) {
				return set
			}
		case <-deadline:
			t.Fatalf("no set %v within %s; last set was %v", want, within, last)
		}
	}
}

func TestRegisterResolveDeregister(t *testing.T) {
	ctx := context.Background()
	r := open(t, nil)
	if got := resolveIDs(t, r, "echo"); len(got) != 0 {
		t.Fatalf("Resolve of an unknown service = %v, want empty", got)
	}
	set, _ := r.Resolve(ctx, "echo")
	if set == nil {
		t.Errorf("Resolve of an unknown service returned nil, want an empty slice")
	}
	mustRegister(t, r, inst("echo", "b"), time.Minute)
	mustRegister(t, r, inst("echo", "a"), 0)
	mustRegister(t, r, inst("other", "c"), time.Minute)
	if got, want := resolveIDs(t, r, "echo"), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("Resolve(echo) = %v, want %v (sorted by ID, other services left out)", got, want)
	}
	set, _ = r.Resolve(ctx, "echo")
	if set[0].Address != "addr-of-a" || set[0].Service != "echo" {
		t.Errorf("resolved instance = %+v, want service echo at addr-of-a", set[0])
	}
	if err := r.Deregister(ctx, inst("echo", "a")); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if got, want := resolveIDs(t, r, "echo"), []string{"b"}; !slices.Equal(got, want) {
		t.Errorf("after Deregister(a): Resolve = %v, want %v", got, want)
	}
	if err := r.Deregister(ctx, inst("echo", "never-registered")); err != nil {
		t.Errorf("Deregister of an unknown instance: %v, want nil", err)
	}
}

func TestRegisterSameIDReplaces(t *testing.T) {
	r := open(t, nil)
	mustRegister(t, r, kernel.Instance{Service: "echo", ID: "x", Address: "old:1"}, time.Minute)
	mustRegister(t, r, kernel.Instance{Service: "echo", ID: "x", Address: "new:2"}, time.Minute)
	set, _ := r.Resolve(context.Background(), "echo")
	if len(set) != 1 || set[0].Address != "new:2" {
		t.Errorf("Resolve = %+v, want only x at new:2", set)
	}
}

func TestRegisterRejectsIncompleteInstances(t *testing.T) {
	r := open(t, nil)
	cases := []struct {
		name string
		in   kernel.Instance
		ttl  time.Duration
		want string
	}{
		{"empty service", kernel.Instance{ID: "a", Address: "x:1"}, time.Second, "empty Service"},
		{"empty id", kernel.Instance{Service: "s", Address: "x:1"}, time.Second, "empty ID"},
		{"empty address", kernel.Instance{Service: "s", ID: "a"}, time.Second, "empty Address"},
		{"negative ttl", inst("s", "a"), -time.Second, "negative ttl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := r.Register(context.Background(), tc.in, tc.ttl)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "memory: ") {
				t.Errorf("Register = %v, want an error starting %q and mentioning %q", err, "memory: ", tc.want)
			}
		})
	}
	if got := resolveIDs(t, r, "s"); len(got) != 0 {
		t.Errorf("rejected registrations are visible: %v", got)
	}
}

func TestNamespaces(t *testing.T) {
	a := open(t, map[string]any{"namespace": "shared-" + t.Name()})
	b := open(t, map[string]any{"namespace": "shared-" + t.Name()})
	other := open(t, map[string]any{"namespace": "other-" + t.Name()})

	mustRegister(t, a, inst("echo", "from-a"), time.Minute)
	mustRegister(t, b, inst("echo", "from-b"), time.Minute)
	want := []string{"from-a", "from-b"}
	if got := resolveIDs(t, a, "echo"); !slices.Equal(got, want) {
		t.Errorf("same namespace, through a: %v, want %v", got, want)
	}
	if got := resolveIDs(t, b, "echo"); !slices.Equal(got, want) {
		t.Errorf("same namespace, through b: %v, want %v", got, want)
	}
	if got := resolveIDs(t, other, "echo"); len(got) != 0 {
		t.Errorf("another namespace sees %v, want nothing", got)
	}
	// Deregistering through another registry of the namespace works too.
	if err := b.Deregister(context.Background(), inst("echo", "from-a")); err != nil {
		t.Fatal(err)
	}
	if got := resolveIDs(t, a, "echo"); !slices.Equal(got, []string{"from-b"}) {
		t.Errorf("after b deregistered from-a, a sees %v, want [from-b]", got)
	}
}

func TestDefaultNamespaceIsShared(t *testing.T) {
	a, err := New(*DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := kernel.NewRegistry(Name, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mustRegister(t, a, inst("default-ns-test", "x"), time.Minute)
	set, _ := b.Resolve(context.Background(), "default-ns-test")
	if got := ids(set); !slices.Equal(got, []string{"x"}) {
		t.Errorf("two registries with default options: b sees %v, want [x]", got)
	}
}

func TestMetadataRoundTripsAndIsCopied(t *testing.T) {
	r := open(t, nil)
	md := map[string]string{"transport": "tcp-lv", "codec": "protobuf", "weight": "3"}
	in := inst("echo", "a")
	in.Metadata = md
	mustRegister(t, r, in, time.Minute)
	md["weight"] = "changed after Register"

	set, _ := r.Resolve(context.Background(), "echo")
	want := map[string]string{"transport": "tcp-lv", "codec": "protobuf", "weight": "3"}
	if got := set[0].Metadata; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Metadata = %v, want %v", got, want)
	}
	set[0].Metadata["weight"] = "changed by a resolver"
	again, _ := r.Resolve(context.Background(), "echo")
	if again[0].Metadata["weight"] != "3" {
		t.Errorf("a caller changing its resolved Metadata changed the store: weight = %q", again[0].Metadata["weight"])
	}
}

func TestInstanceExpiresWhenItsLeaseIsAbandoned(t *testing.T) {
	const ttl = 300 * time.Millisecond
	const tolerance = 400 * time.Millisecond
	a := open(t, map[string]any{"namespace": "ns-" + t.Name()})
	b := open(t, map[string]any{"namespace": "ns-" + t.Name()})

	mustRegister(t, a, inst("echo", "kept"), ttl)
	mustRegister(t, a, inst("echo", "dying"), ttl)
	c := open(t, map[string]any{"namespace": "ns-" + t.Name()})
	mustRegister(t, c, inst("echo", "orphan"), ttl)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := b.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, w, []string{"dying", "kept", "orphan"}, time.Second)

	// c's process "dies": its lease is no longer renewed, nobody deregisters.
	start := time.Now()
	c.AbandonLeases()
	// Nobody resolves: the reaper alone must notice, and tell the watcher.
	receiveUntil(t, w, []string{"dying", "kept"}, ttl+tolerance)
	if took := time.Since(start); took < ttl/2 {
		t.Errorf("orphan expired after %s, before its ttl %s", took, ttl)
	}
	// a keeps its own leases well past the ttl.
	time.Sleep(3 * ttl)
	if got := resolveIDs(t, b, "echo"); !slices.Equal(got, []string{"dying", "kept"}) {
		t.Errorf("after 3 ttl with a open: %v, want [dying kept]", got)
	}
	if err := a.Deregister(context.Background(), inst("echo", "dying")); err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, w, []string{"kept"}, time.Second)
}

func TestDefaultTTLAppliesToZeroTTL(t *testing.T) {
	r := open(t, map[string]any{"default_ttl": "200ms"})
	observer := open(t, nil)
	mustRegister(t, r, inst("echo", "a"), 0)
	r.AbandonLeases()
	deadline := time.Now().Add(200*time.Millisecond + 500*time.Millisecond)
	for len(resolveIDs(t, observer, "echo")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("instance registered with ttl 0 and default_ttl 200ms still there after 700ms")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStaticInstances(t *testing.T) {
	r := open(t, map[string]any{"static": map[string]any{
		"echo":  []any{"10.0.0.2:7000", "10.0.0.1:7000"},
		"other": []any{"10.0.0.9:7000"},
	}})
	mustRegister(t, r, inst("echo", "live"), time.Minute)
	set, err := r.Resolve(context.Background(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(set), []string{"10.0.0.2:7000", "10.0.0.1:7000", "live"}; !slices.Equal(got, want) {
		t.Errorf("Resolve = %v, want %v (static in config order, then registered)", got, want)
	}
	if set[0].Address != "10.0.0.2:7000" || set[0].Service != "echo" {
		t.Errorf("static instance = %+v, want ID = Address = 10.0.0.2:7000, service echo", set[0])
	}
	w, _ := r.Watch(t.Context(), "other")
	if got := ids(receive(t, w, time.Second)); !slices.Equal(got, []string{"10.0.0.9:7000"}) {
		t.Errorf("Watch(other) first set = %v, want the static instance", got)
	}
	// Static lists are the registry's own config, not the namespace's.
	peer := open(t, nil)
	if got := resolveIDs(t, peer, "other"); len(got) != 0 {
		t.Errorf("another registry in the namespace sees static instances %v", got)
	}
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		want    []string // each must appear in the error
	}{
		{"unknown key is named", map[string]any{"namesapce": "x"}, []string{`"memory"`, `"namesapce"`, "test.yaml", "namespace"}},
		{"wrong type is named", map[string]any{"namespace": 5}, []string{`"memory"`, `"namespace"`, "a string"}},
		{"duration without a unit", map[string]any{"default_ttl": 10}, []string{`"memory"`, "5s"}},
		{"bad duration", map[string]any{"default_ttl": "soon"}, []string{`"memory"`, "soon"}},
		{"static must map to lists", map[string]any{"static": map[string]any{"echo": "a:1"}}, []string{`"memory"`, "static"}},
		{"zero default_ttl", map[string]any{"default_ttl": "0s"}, []string{`"default_ttl"`, "positive"}},
		{"empty namespace", map[string]any{"namespace": ""}, []string{`"namespace"`}},
		{"empty static address", map[string]any{"static": map[string]any{"echo": []any{""}}}, []string{`"static"`, "echo", "empty"}},
		{"duplicate static address", map[string]any{"static": map[string]any{"echo": []any{"a:1", "a:1"}}}, []string{`"static"`, "twice"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := kernel.NewRegistry(Name, tc.options, "test.yaml")
			if err == nil {
				reg.Close()
				t.Fatalf("NewRegistry(%v) succeeded, want an error", tc.options)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
		})
	}
}

func TestReportLoad(t *testing.T) {
	r := open(t, nil)
	mustRegister(t, r, inst("echo", "a"), time.Minute)
	w, _ := r.Watch(t.Context(), "echo")
	receive(t, w, time.Second)

	load := kernel.Load{InFlight: 7, QPS: 120.5}
	if err := r.ReportLoad(context.Background(), inst("echo", "a"), load); err != nil {
		t.Fatalf("ReportLoad: %v", err)
	}
	got := receive(t, w, time.Second)[0].Load
	if got.InFlight != 7 || got.QPS != 120.5 || got.Updated.IsZero() {
		t.Errorf("watched Load = %+v, want InFlight 7, QPS 120.5 and Updated set", got)
	}
	set, _ := r.Resolve(context.Background(), "echo")
	if set[0].Load.InFlight != 7 {
		t.Errorf("resolved Load = %+v, want InFlight 7", set[0].Load)
	}
	err := r.ReportLoad(context.Background(), inst("echo", "ghost"), load)
	if err == nil || !strings.Contains(err.Error(), "echo/ghost") {
		t.Errorf("ReportLoad of an unregistered instance = %v, want an error naming echo/ghost", err)
	}
}

func TestCapabilities(t *testing.T) {
	var reg kernel.Registry = open(t, nil)
	caps, ok := reg.(kernel.RegistryCapabilities)
	if !ok || !caps.HonoursTTL() {
		t.Errorf("memory registry should report HonoursTTL() = true")
	}
	if _, ok := reg.(kernel.LoadReporter); !ok {
		t.Errorf("memory registry should implement kernel.LoadReporter")
	}
}

func TestCancelledContext(t *testing.T) {
	r := open(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Register(ctx, inst("echo", "a"), time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Register with a cancelled ctx = %v, want context.Canceled", err)
	}
	if _, err := r.Watch(ctx, "echo"); !errors.Is(err, context.Canceled) {
		t.Errorf("Watch with a cancelled ctx = %v, want context.Canceled", err)
	}
}

func TestNoGoroutineOutlivesItsRegistries(t *testing.T) {
	ns := map[string]any{"namespace": "ns-" + t.Name()}
	a := open(t, ns)
	b := open(t, ns)
	mustRegister(t, a, inst("echo", "a"), time.Minute)
	mustRegister(t, b, inst("echo", "b"), 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := b.Watch(ctx, "echo"); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()
	goleak.VerifyNone(t)
	stores.Lock()
	_, kept := stores.m["ns-"+t.Name()]
	stores.Unlock()
	if kept {
		t.Errorf("the namespace's store outlived its last registry")
	}
}

// A lease its registry keeps does not lapse however late the registry's
// own work runs. It once did: the registry renewed it every ttl/3 on a
// goroutine of its own, and beside a fuzzing run that renewal ran after
// the store's expiry reaper, so a live registry's instance vanished.
func TestAKeptLeaseOutlastsAStalledRegistry(t *testing.T) {
	const ttl = 50 * time.Millisecond
	ns := map[string]any{"namespace": "ns-" + t.Name()}
	a, b := open(t, ns), open(t, ns)
	mustRegister(t, a, inst("echo", "busy"), ttl)
	a.mu.Lock() // whatever a would do waits, as on a starved machine
	time.Sleep(4 * ttl)
	a.mu.Unlock()
	if got := resolveIDs(t, b, "echo"); !slices.Equal(got, []string{"busy"}) {
		t.Errorf("after a stalled for 4 ttl: %v, want [busy]", got)
	}
}

// A client's registry only resolves and watches, and a server's keeps the
// lease of what it registered: neither starts a goroutine, so a
// short-lived client starts and stops none. The store's expiry reaper
// starts with the first lease left to expire.
func TestWatchingAloneStartsNoGoroutine(t *testing.T) {
	r := open(t, map[string]any{"namespace": "ns-" + t.Name(), "static": map[string]any{"echo": []any{"127.0.0.1:1"}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	receive(t, ch, time.Second)
	reaperStarted := func() bool {
		r.store.mu.Lock()
		defer r.store.mu.Unlock()
		return r.store.reaper != nil
	}
	if reaperStarted() {
		t.Fatal("a registry that only watched started the store's expiry reaper")
	}
	mustRegister(t, r, inst("echo", "a"), time.Minute)
	if reaperStarted() {
		t.Fatal("a lease its registry keeps started the store's expiry reaper")
	}
	r.AbandonLeases()
	if !reaperStarted() {
		t.Error("the first lease left to expire did not start the store's expiry reaper")
	}
}

func TestConcurrentUse(t *testing.T) {
	ns := map[string]any{"namespace": "ns-" + t.Name()}
	regs := []*Registry{open(t, ns), open(t, ns), open(t, ns)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var readers sync.WaitGroup
	for _, r := range regs {
		w, err := r.Watch(ctx, "echo")
		if err != nil {
			t.Fatal(err)
		}
		readers.Go(func() {
			for set := range w {
				for _, in := range set {
					_ = in.Metadata["k"] // read what we were given
				}
			}
		})
	}
	var writers sync.WaitGroup
	for g, r := range regs {
		writers.Go(func() {
			for i := range 200 {
				in := inst("echo", fmt.Sprintf("g%d-%d", g, i%10))
				in.Metadata = map[string]string{"k": "v"}
				ttl := time.Minute
				if i%3 == 0 {
					ttl = 5 * time.Millisecond // some expire while others register
				}
				if err := r.Register(ctx, in, ttl); err != nil {
					t.Errorf("Register: %v", err)
					return
				}
				_ = r.ReportLoad(ctx, in, kernel.Load{InFlight: int64(i)}) // may have expired
				if _, err := r.Resolve(ctx, "echo"); err != nil {
					t.Errorf("Resolve: %v", err)
					return
				}
				if i%4 == 0 {
					_ = r.Deregister(ctx, in)
				}
			}
		})
	}
	writers.Wait()
	cancel()
	readers.Wait()
}

// The package doc lists every option with its default; this keeps it in
// step with Options and DefaultOptions.
func TestPackageDocListsEveryOptionWithItsDefault(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "memory.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	defaults, err := json.Marshal(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	if err := json.Unmarshal(defaults, &tree); err != nil {
		t.Fatal(err)
	}
	for key, def := range tree {
		want := fmt.Sprintf("%s: %v", key, def)
		if def == nil {
			want = key + ": {}"
		}
		if !strings.Contains(doc, want) {
			t.Errorf("package doc does not show option %q with its default as %q", key, want)
		}
	}
	if !strings.Contains(doc, fmt.Sprintf("Config name: %q", Name)) {
		t.Errorf("package doc does not give the config name %q", Name)
	}
}
