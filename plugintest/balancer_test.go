package plugintest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
)

// balancerFactory is a factory of balancers without options.
func balancerFactory(name string, build func() kernel.Balancer) kernel.Factory[kernel.Balancer] {
	return kernel.Factory[kernel.Balancer]{Name: name, New: func(any) (kernel.Balancer, error) { return build(), nil }}
}

// balancerBroken is a factory of round-robin balancers, each changed by wrap.
func balancerBroken(wrap func(*roundrobin.Balancer) kernel.Balancer) kernel.Factory[kernel.Balancer] {
	return balancerFactory("broken-round-robin", func() kernel.Balancer { return wrap(roundrobin.New()) })
}

func TestBalancerGoodPluginsPass(t *testing.T) {
	cases := []struct {
		name    string
		f       kernel.Factory[kernel.Balancer]
		spread  Spread
		skipped []string // the subtests that must be skipped, and only those
	}{
		{"RoundRobin", roundrobin.Factory, SpreadRoundRobin, []string{"Balancer/PickObserver"}},
		{"RoundRobinPromisingNothing", roundrobin.Factory, SpreadAny,
			[]string{"Balancer/Spread", "Balancer/Concurrent/Spread", "Balancer/PickObserver"}},
		{"Weighted", balancerFactory("weighted", func() kernel.Balancer { return &balancerWeightedRef{} }), SpreadWeighted, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// With Metadata, so that the Keyed checks run too (none of
			// these reads it).
			cfg := BalancerConfig{Spread: tc.spread, Metadata: kernel.Metadata{"x-hash-key": "user"}}
			rec := record(t, "Balancer", func(t tb) { balancerSuite(t, tc.f, cfg) })
			for _, f := range rec.failures {
				t.Errorf("a good balancer failed %s: %s", f.path, f.msg)
			}
			for _, s := range rec.skips {
				want := slices.ContainsFunc(tc.skipped, func(p string) bool { return s.path == p || strings.HasPrefix(s.path, p+"/") })
				if !want && !strings.HasSuffix(s.path, "Options/WrongType") {
					t.Errorf("%s was skipped: %s", s.path, s.msg)
				}
			}
			for _, path := range tc.skipped {
				if rec.skippedUnder(path) == "" {
					t.Errorf("%s was not skipped; want it skipped, with the reason", path)
				}
			}
		})
	}
}

// TestBalancerCatchesBrokenPlugins runs the suite on balancers with one
// defect each and checks that the subtest for that property fails.
func TestBalancerCatchesBrokenPlugins(t *testing.T) {
	cases := []struct {
		name   string
		f      kernel.Factory[kernel.Balancer]
		spread Spread
		caught []string
	}{
		{"NilErrorWhenEmpty", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return balancerNilWhenEmpty{b} }), SpreadRoundRobin,
			[]string{"Balancer/Empty/NeverUpdated", "Balancer/Empty/EmptySet", "Balancer/Empty/UpdatedToNil"}},
		{"PlainErrorWhenEmpty", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return balancerPlainError{b} }), SpreadRoundRobin,
			[]string{"Balancer/Empty/NeverUpdated", "Balancer/Empty/EmptySet", "Balancer/Empty/UpdatedToNil"}},
		{"InstanceBesideTheErrorWhenEmpty", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return balancerFallbackWhenEmpty{b} }), SpreadRoundRobin,
			[]string{"Balancer/Empty/NeverUpdated", "Balancer/Empty/EmptySet", "Balancer/Empty/UpdatedToNil"}},
		{"KeepsSetOnEmptyUpdate", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return balancerKeepsOnEmpty{b} }), SpreadRoundRobin,
			[]string{"Balancer/Empty/UpdatedToNil"}},
		{"StripsPort", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return balancerStripsPort{b} }), SpreadAny,
			[]string{"Balancer/Picks/FromSet"}},
		{"StalePickAfterUpdate", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerStale{Balancer: b} }), SpreadAny,
			[]string{"Balancer/Picks/AfterUpdate"}},
		{"RoundRobinRepeats", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerRepeats{Balancer: b} }), SpreadRoundRobin,
			[]string{"Balancer/Spread/RoundRobin"}},
		{"IgnoresWeights", roundrobin.Factory, SpreadWeighted,
			[]string{"Balancer/Spread/Weighted", "Balancer/Concurrent/Spread"}},
		{"UnsynchronisedCounter", balancerFactory("racy", func() kernel.Balancer { return &balancerRacyCounter{} }), SpreadRoundRobin,
			[]string{"Balancer/Concurrent/Spread"}},
		{"UpdateClearsThenRefills", balancerFactory("clear-refill", func() kernel.Balancer { return &balancerClearThenRefill{} }), SpreadRoundRobin,
			[]string{"Balancer/Concurrent/PicksAndUpdates"}},
		{"DonePanicsOnFailure", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerFailureCounter{Balancer: b} }), SpreadRoundRobin,
			[]string{"Balancer/PickObserver/Done"}},
		{"DonePanicsOnReplacedInstance", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerInFlight{Balancer: b} }), SpreadRoundRobin,
			[]string{"Balancer/PickObserver/DoneAfterUpdate"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := record(t, "Balancer", func(t tb) { balancerSuite(t, tc.f, BalancerConfig{Spread: tc.spread}) })
			for _, path := range tc.caught {
				expectCaught(t, rec, path)
			}
		})
	}
}

// balancerWeightedRef is a correct weighted balancer, the smooth weighted
// round-robin nginx uses, with a PickObserver that counts calls in flight:
// the suite must pass it.
type balancerWeightedRef struct {
	mu       sync.Mutex
	set      []kernel.Instance
	weights  []int
	current  []int
	inFlight map[string]int
}

func (b *balancerWeightedRef) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set = instances
	b.weights = make([]int, len(instances))
	b.current = make([]int, len(instances))
	for i, in := range instances {
		b.weights[i] = 1
		if w, err := strconv.Atoi(in.Metadata["weight"]); err == nil && w > 0 {
			b.weights[i] = w
		}
	}
}

func (b *balancerWeightedRef) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return nil, fmt.Errorf("weighted: %w", kernel.ErrNoInstances)
	}
	best, total := 0, 0
	for i, w := range b.weights {
		b.current[i] += w
		total += w
		if b.current[i] > b.current[best] {
			best = i
		}
	}
	b.current[best] -= total
	if b.inFlight == nil {
		b.inFlight = make(map[string]int)
	}
	b.inFlight[b.set[best].ID]++
	return &b.set[best], nil
}

func (b *balancerWeightedRef) Done(inst *kernel.Instance, _ error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight[inst.ID]--; b.inFlight[inst.ID] <= 0 {
		delete(b.inFlight, inst.ID)
	}
}

// balancerFallbackWhenEmpty returns, beside ErrNoInstances, a default
// instance, as a balancer with a fallback address might: a caller that
// checks the instance before the error calls it.
type balancerFallbackWhenEmpty struct{ *roundrobin.Balancer }

func (b balancerFallbackWhenEmpty) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if errors.Is(err, kernel.ErrNoInstances) {
		return &kernel.Instance{ID: "fallback", Address: "127.0.0.1:1"}, err
	}
	return inst, err
}

type balancerNilWhenEmpty struct{ *roundrobin.Balancer }

func (b balancerNilWhenEmpty) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if errors.Is(err, kernel.ErrNoInstances) {
		return nil, nil
	}
	return inst, err
}

type balancerPlainError struct{ *roundrobin.Balancer }

func (b balancerPlainError) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if err != nil {
		return nil, errors.New("broken: nothing to pick from")
	}
	return inst, nil
}

// balancerKeepsOnEmpty ignores an empty set, to "ride out" a registry that
// briefly lists nothing.
type balancerKeepsOnEmpty struct{ *roundrobin.Balancer }

func (b balancerKeepsOnEmpty) Update(instances []kernel.Instance) {
	if len(instances) > 0 {
		b.Balancer.Update(instances)
	}
}

// balancerStripsPort returns a copy of the pick whose Address lost its port.
type balancerStripsPort struct{ *roundrobin.Balancer }

func (b balancerStripsPort) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if err != nil {
		return nil, err
	}
	out := *inst
	if host, _, err := net.SplitHostPort(out.Address); err == nil {
		out.Address = host
	}
	return &out, nil
}

// balancerStale answers the first Pick after an Update with the previous
// pick, as misguided connection affinity would.
type balancerStale struct {
	*roundrobin.Balancer
	mu      sync.Mutex
	last    *kernel.Instance
	updated bool
}

func (b *balancerStale) Update(instances []kernel.Instance) {
	b.mu.Lock()
	b.updated = true
	b.mu.Unlock()
	b.Balancer.Update(instances)
}

func (b *balancerStale) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.updated && b.last != nil {
		b.updated = false
		return b.last, nil
	}
	inst, err := b.Balancer.Pick(ctx, info)
	if err == nil {
		b.last = inst
	}
	return inst, err
}

// balancerRepeats sends every fourth call to the instance before it.
type balancerRepeats struct {
	*roundrobin.Balancer
	mu   sync.Mutex
	n    int
	last *kernel.Instance
}

func (b *balancerRepeats) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n++; b.n%4 == 0 && b.last != nil {
		return b.last, nil
	}
	inst, err := b.Balancer.Pick(ctx, info)
	b.last = inst
	return inst, err
}

// balancerRacyCounter is round-robin whose count is a load and a store
// rather than one atomic add, so concurrent picks lose turns. (Both are
// atomic, so that -race does not stop the test before the suite sees it.)
type balancerRacyCounter struct {
	set  atomic.Pointer[[]kernel.Instance]
	next atomic.Uint64
}

func (b *balancerRacyCounter) Update(instances []kernel.Instance) { b.set.Store(&instances) }

func (b *balancerRacyCounter) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	p := b.set.Load()
	if p == nil || len(*p) == 0 {
		return nil, fmt.Errorf("racy: %w", kernel.ErrNoInstances)
	}
	n := b.next.Load()
	runtime.Gosched() // the window a loaded machine opens between the two
	b.next.Store(n + 1)
	return &(*p)[n%uint64(len(*p))], nil
}

// balancerClearThenRefill empties its set and then fills it in two steps,
// so that a Pick in between finds nothing.
type balancerClearThenRefill struct {
	mu  sync.Mutex
	set []kernel.Instance
	n   int
}

func (b *balancerClearThenRefill) Update(instances []kernel.Instance) {
	b.mu.Lock()
	b.set = nil
	b.mu.Unlock()
	runtime.Gosched()
	b.mu.Lock()
	b.set = slices.Clone(instances)
	b.mu.Unlock()
}

func (b *balancerClearThenRefill) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return nil, fmt.Errorf("clear-refill: %w", kernel.ErrNoInstances)
	}
	b.n++
	return &b.set[b.n%len(b.set)], nil
}

// balancerFailureCounter counts failed calls per instance in a map it never
// made.
type balancerFailureCounter struct {
	*roundrobin.Balancer
	mu       sync.Mutex
	failures map[string]int
}

func (b *balancerFailureCounter) Done(inst *kernel.Instance, err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures[inst.ID]++
}

// balancerInFlight counts calls in flight in counters it makes for each
// set, and finds none for an instance of a set since replaced.
type balancerInFlight struct {
	*roundrobin.Balancer
	mu       sync.Mutex
	inFlight map[string]*int
}

func (b *balancerInFlight) Update(instances []kernel.Instance) {
	b.mu.Lock()
	b.inFlight = make(map[string]*int, len(instances))
	for _, in := range instances {
		b.inFlight[in.ID] = new(int)
	}
	b.mu.Unlock()
	b.Balancer.Update(instances)
}

func (b *balancerInFlight) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if err == nil {
		b.mu.Lock()
		if c := b.inFlight[inst.ID]; c != nil {
			*c++
		}
		b.mu.Unlock()
	}
	return inst, err
}

func (b *balancerInFlight) Done(inst *kernel.Instance, _ error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	*b.inFlight[inst.ID]--
}

// metadataDropping returns a copy of each pick with the instance's
// Metadata dropped: Service, ID and Address are right, but the metadata
// the registry reported (zone, weight, codec hints, ...) is gone, so the
// pick is not "an instance of the set, unchanged".
type metadataDropping struct{ *roundrobin.Balancer }

func (b metadataDropping) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	inst, err := b.Balancer.Pick(ctx, info)
	if err != nil {
		return nil, err
	}
	out := *inst
	out.Metadata = nil
	return &out, nil
}

// A pick must be one of the set's instances unchanged, metadata and all.
func TestBalancerThatDropsMetadataIsCaught(t *testing.T) {
	f := balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return metadataDropping{b} })
	rec := record(t, "Balancer", func(t tb) { balancerSuite(t, f, BalancerConfig{Spread: SpreadRoundRobin}) })
	expectCaught(t, rec, "Balancer/Picks/FromSet")
	expectCaught(t, rec, "Balancer/Picks/KeptAfterUpdate")
}
