package plugintest

import (
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"

	"github.com/kernrpc/kernrpc/kernel"
)

// Helpers the balancer checks share: instance sets, picks that report
// what went wrong, and shares checked against their weights.

// balancerWeighted is a set with weights 1, 2 and 5.
func balancerWeighted() []kernel.Instance {
	set := balancerSet("w", 3)
	for i, w := range []string{"1", "2", "5"} {
		set[i].Metadata = map[string]string{"weight": w}
	}
	return set
}

// balancerCheckShares checks how many picks each instance of set got
// against what cfg.Spread promises: the same number each for round-robin,
// the share of the weight for weighted.
func balancerCheckShares(t tb, counts map[string]int, set []kernel.Instance, cfg BalancerConfig, how string) {
	t.Helper()
	total := 0
	for _, n := range counts {
		total += n
	}
	totalWeight := 0
	weights := make([]int, len(set))
	for i, in := range set {
		weights[i] = 1
		if cfg.Spread == SpreadWeighted {
			w, err := strconv.Atoi(in.Metadata["weight"])
			if err != nil {
				t.Fatalf("instance %s has weight %q: %v", in.ID, in.Metadata["weight"], err)
			}
			weights[i] = w
		}
		totalWeight += weights[i]
	}
	var bad []string
	for i, in := range set {
		want := float64(total) * float64(weights[i]) / float64(totalWeight)
		got := float64(counts[in.ID])
		switch cfg.Spread {
		case SpreadRoundRobin:
			if got != want {
				bad = append(bad, fmt.Sprintf("%s got %d picks, want %.0f", in.ID, counts[in.ID], want))
			}
		case SpreadWeighted:
			if math.Abs(got-want)/want > cfg.tolerance() {
				bad = append(bad, fmt.Sprintf("%s (weight %d) got %d picks, want %.0f ± %.0f%%",
					in.ID, weights[i], counts[in.ID], want, 100*cfg.tolerance()))
			}
		}
	}
	if len(bad) > 0 {
		const shown = 5
		if len(bad) > shown {
			bad = append(bad[:shown], fmt.Sprintf("and %d more", len(bad)-shown))
		}
		t.Errorf("%d picks%s over %d instances do not spread as %s promises: %s", total, how, len(set), cfg.Spread, strings.Join(bad, "; "))
	}
}

// balancerSet returns n instances whose IDs start with prefix and whose
// Address and Metadata are derived from the ID, so that a mixed-up
// instance, or one whose metadata was dropped or changed, is noticed.
func balancerSet(prefix string, n int) []kernel.Instance {
	set := make([]kernel.Instance, n)
	for i := range set {
		id := fmt.Sprintf("%s%d", prefix, i)
		set[i] = kernel.Instance{Service: "plugintest", ID: id, Address: id + ".plugintest.invalid:7000",
			Metadata: map[string]string{"zone": "zone-" + id}}
	}
	return set
}

func balancerInfo() *kernel.CallInfo {
	return &kernel.CallInfo{Method: "plugintest.Echo/Say", Side: kernel.ClientSide, Metadata: kernel.Metadata{}}
}

// balancerPick picks from b, which was given set, and fails t unless the
// pick is one of set's instances, unchanged.
func balancerPick(t tb, b kernel.Balancer, info *kernel.CallInfo, set []kernel.Instance, when string) *kernel.Instance {
	t.Helper()
	if when != "" {
		when = " " + when
	}
	inst, err := b.Pick(t.Context(), info)
	if err != nil {
		t.Fatalf("Pick%s: %v; want an instance of %s", when, err, balancerFormatSet(set))
	}
	for i := range set {
		if balancerSame(inst, &set[i]) {
			return inst
		}
	}
	for i := range set {
		if set[i].ID == balancerID(inst) {
			t.Fatalf("Pick%s = %s with metadata %v, but the set's instance %s is %s with metadata %v: a pick must be one of the set's instances, unchanged",
				when, balancerFormat(inst), inst.Metadata, set[i].ID, balancerFormat(&set[i]), set[i].Metadata)
		}
	}
	t.Fatalf("Pick%s = %s; want an instance of the current set %s", when, balancerFormat(inst), balancerFormatSet(set))
	return nil
}

// balancerSame reports whether a is b unchanged: Service, ID, Address and
// Metadata (the engine and PickObservers read the pick's metadata).
func balancerSame(a, b *kernel.Instance) bool {
	return a != nil && a.ID == b.ID && a.Address == b.Address && a.Service == b.Service && maps.Equal(a.Metadata, b.Metadata)
}

func balancerID(inst *kernel.Instance) string {
	if inst == nil {
		return ""
	}
	return inst.ID
}

func balancerFormat(inst *kernel.Instance) string {
	if inst == nil {
		return "nil"
	}
	return fmt.Sprintf("{%s at %s}", inst.ID, inst.Address)
}

func balancerFormatSet(set []kernel.Instance) string {
	ids := make([]string, len(set))
	for i, in := range set {
		ids[i] = in.ID
	}
	return "[" + strings.Join(ids, " ") + "]"
}
