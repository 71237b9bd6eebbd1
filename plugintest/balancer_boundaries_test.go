package plugintest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
)

// TestBalancerCatchesBoundaryDefects: balancers with one defect each that
// shows only after later Updates, caught by the subtest of the property
// it breaks.
func TestBalancerCatchesBoundaryDefects(t *testing.T) {
	cases := []struct {
		name   string
		f      kernel.Factory[kernel.Balancer]
		spread Spread
		caught string
	}{
		{"IgnoresUpdatesOfTheSameSize", balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerSameSizeNoop{Balancer: b} }),
			SpreadAny, "Balancer/Picks/AfterUpdate"},
		{"CopiesSetsIntoOneBuffer", balancerFactory("buffered", func() kernel.Balancer { return &balancerOneBuffer{} }),
			SpreadAny, "Balancer/Picks/KeptAfterUpdate"},
		{"KeepsTheFirstSetsSize", balancerFactory("first-size", func() kernel.Balancer { return &balancerFirstSize{} }),
			SpreadRoundRobin, "Balancer/Spread/Updates"},
		{"ParsesWeightsOnce", balancerFactory("weights-once", func() kernel.Balancer {
			return &balancerWeightsOnce{balancerWeightedRef: &balancerWeightedRef{}, known: map[string]int{}}
		}), SpreadWeighted, "Balancer/Spread/Updates"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := record(t, "Balancer", func(t tb) { balancerSuite(t, tc.f, BalancerConfig{Spread: tc.spread}) })
			expectCaught(t, rec, tc.caught)
		})
	}
}

// balancerSameSizeNoop takes an Update with as many instances as the
// current set for no change at all, to spare rebuilding its state.
type balancerSameSizeNoop struct {
	*roundrobin.Balancer
	mu sync.Mutex
	n  int
}

func (b *balancerSameSizeNoop) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(instances) == b.n && b.n > 0 {
		return
	}
	b.n = len(instances)
	b.Balancer.Update(instances)
}

// balancerOneBuffer copies each set into one buffer it reuses, to spare
// an allocation per Update, and returns pointers into it: an instance a
// call holds changes under it at the next Update.
type balancerOneBuffer struct {
	mu   sync.Mutex
	buf  []kernel.Instance
	next atomic.Uint64
}

func (b *balancerOneBuffer) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cap(b.buf) < len(instances) {
		b.buf = make([]kernel.Instance, len(instances), 2*len(instances))
	}
	b.buf = b.buf[:len(instances)]
	balancerCopyInto(b.buf, instances)
}

// balancerCopyInto is not instrumented by -race, so that the race of
// callers reading what it overwrites does not stop the test before the
// suite sees the defect.
//
//go:norace
func balancerCopyInto(dst, src []kernel.Instance) {
	//lint:ignore S1001 not copy: the runtime's typed copy reports races itself, norace or not
	for i := range src {
		dst[i] = src[i]
	}
}

func (b *balancerOneBuffer) Pick(_ context.Context, _ *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) == 0 {
		return nil, fmt.Errorf("buffered: %w", kernel.ErrNoInstances)
	}
	return &b.buf[b.next.Add(1)%uint64(len(b.buf))], nil
}

// balancerFirstSize is round-robin that counts turns modulo the size of
// the first set it was given, clamped into the current one.
type balancerFirstSize struct {
	mu    sync.Mutex
	set   []kernel.Instance
	first int
	next  int
}

func (b *balancerFirstSize) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.first == 0 {
		b.first = len(instances)
	}
	b.set = instances
}

func (b *balancerFirstSize) Pick(_ context.Context, _ *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return nil, fmt.Errorf("first-size: %w", kernel.ErrNoInstances)
	}
	i := b.next % max(b.first, 1)
	b.next++
	return &b.set[min(i, len(b.set)-1)], nil
}

// balancerWeightsOnce is the smooth weighted balancer that parses an
// instance's weight the first time it sees its ID, and keeps it.
type balancerWeightsOnce struct {
	*balancerWeightedRef
	known map[string]int
}

func (b *balancerWeightsOnce) Update(instances []kernel.Instance) {
	b.mu.Lock()
	set := make([]kernel.Instance, len(instances))
	copy(set, instances)
	for i, in := range set {
		w, seen := b.known[in.ID]
		if !seen {
			w, _ = strconv.Atoi(in.Metadata["weight"])
			b.known[in.ID] = w
		}
		set[i].Metadata = map[string]string{"weight": strconv.Itoa(w)}
	}
	b.mu.Unlock()
	b.balancerWeightedRef.Update(set)
}
