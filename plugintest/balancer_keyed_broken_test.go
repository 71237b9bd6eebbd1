package plugintest

import (
	"context"
	"hash/fnv"
	"strings"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
)

// balancerStaleRing sends a call with the key to an instance of the first
// set it was given, as a hash ring built once and never rebuilt does;
// calls without the key go round-robin over the current set.
type balancerStaleRing struct {
	*roundrobin.Balancer
	mu   sync.Mutex
	ring []kernel.Instance
}

const balancerKey = "x-hash-key"

func (b *balancerStaleRing) Update(instances []kernel.Instance) {
	b.mu.Lock()
	if b.ring == nil && len(instances) > 0 {
		b.ring = instances
	}
	b.mu.Unlock()
	b.Balancer.Update(instances)
}

func (b *balancerStaleRing) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	key, ok := info.Metadata[balancerKey]
	if !ok {
		return b.Balancer.Pick(ctx, info)
	}
	// An empty set still answers as the kernel asks.
	if _, err := b.Balancer.Pick(ctx, info); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := fnv.New32a()
	h.Write([]byte(key))
	return &b.ring[int(h.Sum32())%len(b.ring)], nil
}

// TestBalancerChecksKeyedPicks: a balancer whose keyed path picks from a
// set no longer current passed every check before the Keyed ones, which
// pick with BalancerConfig.Metadata, and is caught by them; the Keyed
// checks are skipped, saying so, without Metadata.
func TestBalancerChecksKeyedPicks(t *testing.T) {
	f := balancerBroken(func(b *roundrobin.Balancer) kernel.Balancer { return &balancerStaleRing{Balancer: b} })
	rec := record(t, "Balancer", func(t tb) {
		balancerSuite(t, f, BalancerConfig{Spread: SpreadRoundRobin, Metadata: kernel.Metadata{balancerKey: "user"}})
	})
	expectCaught(t, rec, "Balancer/Keyed/AfterUpdate")
	for _, fl := range rec.failures {
		if !strings.HasPrefix(fl.path, "Balancer/Keyed/") {
			t.Errorf("the broken balancer failed %s, outside the Keyed checks: %s", fl.path, fl.msg)
		}
	}
	rec = record(t, "Balancer", func(t tb) { balancerSuite(t, f, BalancerConfig{Spread: SpreadRoundRobin}) })
	if why := rec.skippedUnder("Balancer/Keyed"); !strings.Contains(why, "BalancerConfig.Metadata") {
		t.Errorf("Balancer/Keyed without BalancerConfig.Metadata: skip reason %q; want one naming it", why)
	}
	for _, fl := range rec.failures {
		t.Errorf("without Metadata, the balancer broken only on its keyed path failed %s: %s", fl.path, fl.msg)
	}
}
