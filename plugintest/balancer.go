package plugintest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// Spread is what a balancer promises about how it spreads calls over the
// instances of a set.
type Spread int

const (
	// SpreadAny promises nothing beyond picking from the current set (a
	// consistent-hash balancer sends every call with one key to the same
	// instance). It is the zero value: the Spread subtests are skipped.
	SpreadAny Spread = iota
	// SpreadRoundRobin promises exact rotation: every run of n consecutive
	// picks from a set of n instances picks each instance once, in the same
	// order each time.
	SpreadRoundRobin
	// SpreadWeighted promises that, over many picks, each instance's share
	// of them is its share of the total weight (its Metadata["weight"], an
	// integer), within BalancerConfig.Tolerance.
	SpreadWeighted
)

func (s Spread) String() string {
	switch s {
	case SpreadAny:
		return "SpreadAny"
	case SpreadRoundRobin:
		return "SpreadRoundRobin"
	case SpreadWeighted:
		return "SpreadWeighted"
	}
	return "Spread(" + strconv.Itoa(int(s)) + ")"
}

// BalancerConfig tells Balancer how to build the balancer under test and
// what it promises. The zero value builds it with default options and
// checks everything but the spread of picks.
type BalancerConfig struct {
	// Options is the balancer's options block.
	Options map[string]any
	// Spread is how the balancer promises to spread picks; SpreadAny (the
	// zero value) skips the Spread subtests.
	Spread Spread
	// Tolerance is, for SpreadWeighted, the largest relative error allowed
	// between an instance's share of the picks and its share of the weight
	// (0.1: a weight-2 instance among weights 1, 2 and 5 gets 25% ± 2.5%);
	// 0 means 0.1. The suite makes enough picks that a fair weighted random
	// choice is off by more than 0.1 in fewer than one run in a million.
	Tolerance float64
	// Metadata is call metadata the balancer reads (consistent-hash's
	// key). The Keyed subtests pick with it, each pick with values of its
	// own (the value given, then a dash and a number), and hold those
	// picks to what the others check; nil skips them. Give it: picks
	// with the key and picks without it take different paths.
	Metadata kernel.Metadata
}

func (c BalancerConfig) tolerance() float64 {
	if c.Tolerance > 0 {
		return c.Tolerance
	}
	return 0.1
}

// Balancer certifies the balancer f builds from cfg.Options. It checks:
//
//   - Lifecycle, Options: as for every plugin kind (use updates a set and
//     picks from it).
//   - Picks/FromSet: every pick is an instance of the set given to Update,
//     unchanged.
//   - Picks/AfterUpdate: after each of several Updates (a disjoint set, a
//     smaller one, a larger one, one of the same size with an instance
//     replaced, and one equal to an earlier set), every pick is an
//     instance of the current set: none is an instance removed since.
//   - Picks/KeptAfterUpdate: an instance Pick returned is unchanged
//     (Service, ID, Address, Metadata) after later Updates and picks, as
//     kernel.Balancer requires: a call in flight still uses it.
//   - Empty/NeverUpdated, Empty/EmptySet, Empty/UpdatedToNil: with no
//     instances, Pick returns a nil instance and an error wrapping
//     kernel.ErrNoInstances, also after Update(nil) follows a set.
//   - Spread/RoundRobin/N or Spread/Weighted: picks spread as cfg.Spread
//     promises (skipped for SpreadAny).
//   - Spread/Updates: after each of several successive Updates (the set
//     shrinks, grows, has one instance replaced, returns to an earlier
//     set, and for SpreadWeighted keeps its IDs but changes their
//     weights), picks spread over the new set as promised: a balancer that
//     keeps state of an earlier set (its size, its weights) fails.
//   - Concurrent/PicksAndUpdates: Pick from many goroutines while another
//     calls Update neither fails nor returns an instance of no set it was
//     given (run the test with -race too).
//   - Concurrent/Spread: concurrent picks still spread as promised; for
//     round-robin, as many picks as instances pick each once: no turn is
//     lost or taken twice.
//   - Keyed/FromSet, Keyed/AfterUpdate, Keyed/KeptAfterUpdate,
//     Keyed/EmptySet, Keyed/UpdatedToNil, Keyed/Concurrent: the Picks and
//     Empty checks and Concurrent/PicksAndUpdates again, every pick
//     carrying BalancerConfig.Metadata with values that change from pick
//     to pick (skipped when it is empty): the path of a pick with the
//     key a balancer reads is held to kernel.Balancer as well.
//   - PickObserver/Done, PickObserver/DoneAfterUpdate: a balancer that
//     implements kernel.PickObserver takes Done for successful and failed
//     calls, and for instances of a set since replaced, without panicking
//     and still picking from the current set (skipped otherwise).
func Balancer(t *testing.T, f kernel.Factory[kernel.Balancer], cfg BalancerConfig) {
	t.Helper()
	balancerSuite(wrap(t), f, cfg)
}

func balancerSuite(t tb, f kernel.Factory[kernel.Balancer], cfg BalancerConfig) {
	lifecycle(t, f, cfg.Options, balancerUse)
	s := balancerRun{f: f, cfg: cfg}
	t.Run("Picks", func(t tb) {
		t.Run("FromSet", s.picksFromSet)
		t.Run("AfterUpdate", s.picksAfterUpdate)
		t.Run("KeptAfterUpdate", s.picksKeptAfterUpdate)
	})
	t.Run("Empty", func(t tb) {
		t.Run("NeverUpdated", func(t tb) { s.empty(t, func(kernel.Balancer) {}) })
		t.Run("EmptySet", func(t tb) { s.empty(t, func(b kernel.Balancer) { b.Update([]kernel.Instance{}) }) })
		t.Run("UpdatedToNil", func(t tb) {
			s.empty(t, func(b kernel.Balancer) {
				set := balancerSet("a", 3)
				b.Update(set)
				balancerPick(t, b, balancerInfo(), set, "before Update(nil)")
				b.Update(nil)
			})
		})
	})
	t.Run("Spread", s.spread)
	t.Run("Concurrent", func(t tb) {
		t.Run("PicksAndUpdates", s.concurrentPicksAndUpdates)
		t.Run("Spread", s.concurrentSpread)
	})
	t.Run("Keyed", func(t tb) {
		if len(cfg.Metadata) == 0 {
			t.Skipf("BalancerConfig.Metadata is empty: every pick carries no call metadata; give the entries the balancer reads " +
				"(consistent-hash's key) to have picks with them checked")
		}
		k := s
		k.keyed = new(atomic.Int64)
		t.Run("FromSet", k.picksFromSet)
		t.Run("AfterUpdate", k.picksAfterUpdate)
		t.Run("KeptAfterUpdate", k.picksKeptAfterUpdate)
		t.Run("EmptySet", func(t tb) { k.empty(t, func(b kernel.Balancer) { b.Update([]kernel.Instance{}) }) })
		t.Run("UpdatedToNil", func(t tb) {
			k.empty(t, func(b kernel.Balancer) {
				set := balancerSet("a", 3)
				b.Update(set)
				balancerPick(t, b, k.info(), set, "before Update(nil)")
				b.Update(nil)
			})
		})
		t.Run("Concurrent", k.concurrentPicksAndUpdates)
	})
	t.Run("PickObserver", func(t tb) {
		t.Run("Done", s.observerDone)
		t.Run("DoneAfterUpdate", s.observerDoneAfterUpdate)
	})
}

// balancerUse is the lifecycle's brief use of a balancer: pick from a set.
func balancerUse(t tb, b kernel.Balancer) {
	t.Helper()
	set := balancerSet("use", 3)
	b.Update(set)
	for range 2 * len(set) {
		inst := balancerPick(t, b, balancerInfo(), set, "")
		if obs, ok := b.(kernel.PickObserver); ok {
			obs.Done(inst, nil)
		}
	}
}

type balancerRun struct {
	f   kernel.Factory[kernel.Balancer]
	cfg BalancerConfig
	// keyed, when set, numbers the picks that carry cfg.Metadata.
	keyed *atomic.Int64
}

// info is the CallInfo of one pick: without metadata, or, for the Keyed
// checks, with cfg.Metadata, each value followed by the pick's number.
func (s balancerRun) info() *kernel.CallInfo {
	info := balancerInfo()
	if s.keyed == nil {
		return info
	}
	n := strconv.FormatInt(s.keyed.Add(1), 10)
	for k, v := range s.cfg.Metadata {
		info.Metadata[k] = v + "-" + n
	}
	return info
}

func (s balancerRun) open(t tb) kernel.Balancer {
	t.Helper()
	b := build(t, s.f, s.cfg.Options)
	t.Cleanup(func() { closePlugin(b) })
	return b
}

func (s balancerRun) picksFromSet(t tb) {
	b := s.open(t)
	set := balancerSet("a", 5)
	b.Update(set)
	for range 10 * len(set) {
		balancerPick(t, b, s.info(), set, "")
	}
}

func (s balancerRun) picksAfterUpdate(t tb) {
	b := s.open(t)
	for _, step := range balancerSteps() {
		b.Update(step.set)
		for range 4 * len(step.set) {
			balancerPick(t, b, s.info(), step.set, "after "+step.what)
		}
	}
}

// balancerStep is one Update of a run, and what it does to the set.
type balancerStep struct {
	set  []kernel.Instance
	what string
}

// balancerSteps is a run of Updates, each set a fresh slice: a disjoint
// set, a smaller and a larger one, one of the same size with one instance
// replaced, and one equal to an earlier set.
func balancerSteps() []balancerStep {
	first, second := balancerSet("first", 3), balancerSet("second", 4)
	replaced := slices.Clone(second)
	replaced[1] = balancerSet("new", 1)[0]
	return []balancerStep{
		{first, "a set"},
		{second, "Update to a disjoint set"},
		{slices.Clone(second[:2]), "Update to a smaller set"},
		{append(balancerSet("third", 2), second[0], second[3]), "Update to a larger set"},
		{slices.Clone(second), "Update to a set of the same size"},
		{replaced, "Update to a set of the same size with one instance replaced"},
		{balancerSet("first", 3), "Update back to the first set"},
	}
}

// picksKeptAfterUpdate keeps the instances Pick returned and reads them
// again after later Updates, which must not have written into them.
func (s balancerRun) picksKeptAfterUpdate(t tb) {
	b := s.open(t)
	type kept struct {
		inst *kernel.Instance
		was  kernel.Instance
	}
	var held []kept
	for i, step := range balancerSteps() {
		for j := range step.set {
			step.set[j].Metadata = map[string]string{"step": strconv.Itoa(i), "zone": step.set[j].ID}
		}
		b.Update(step.set)
		for range len(step.set) {
			inst := balancerPick(t, b, s.info(), step.set, "after "+step.what)
			was := *inst
			was.Metadata = maps.Clone(inst.Metadata)
			held = append(held, kept{inst, was})
			if obs, ok := b.(kernel.PickObserver); ok {
				obs.Done(inst, nil)
			}
		}
	}
	for _, k := range held {
		if !balancerSame(k.inst, &k.was) || !maps.Equal(k.inst.Metadata, k.was.Metadata) {
			t.Errorf("an instance Pick returned as %s %v is %s %v after later Updates; the instance a call holds must stay "+
				"unchanged (point into the set Update was given, or copy each set into memory never written again)",
				balancerFormat(&k.was), k.was.Metadata, balancerFormat(k.inst), k.inst.Metadata)
			return
		}
	}
}

// empty checks Pick after prepare has left b with no instances.
func (s balancerRun) empty(t tb, prepare func(kernel.Balancer)) {
	b := s.open(t)
	prepare(b)
	inst, err := b.Pick(t.Context(), s.info())
	switch {
	case err == nil:
		t.Fatalf("Pick with no instances = %s, nil error; want an error wrapping kernel.ErrNoInstances", balancerFormat(inst))
	case !errors.Is(err, kernel.ErrNoInstances):
		t.Errorf("Pick with no instances: error %q does not wrap kernel.ErrNoInstances; the client tells "+
			"\"nothing to call\" (retryable once servers register) from other failures by it", err)
	}
	if inst != nil {
		t.Errorf("Pick with no instances returned instance %s along with its error; want nil", balancerFormat(inst))
	}
}

func (s balancerRun) spread(t tb) {
	switch s.cfg.Spread {
	case SpreadAny:
		t.Skipf("BalancerConfig.Spread is SpreadAny: the balancer promises only to pick from the current set")
	case SpreadRoundRobin:
		t.Run("RoundRobin", func(t tb) {
			for _, n := range []int{1, 2, 5} {
				name := fmt.Sprintf("%dInstances", n)
				if n == 1 {
					name = "1Instance"
				}
				t.Run(name, func(t tb) {
					b := s.open(t)
					set := balancerSet("rr", n)
					b.Update(set)
					balancerRotation(t, b, set, "")
				})
			}
		})
		t.Run("Updates", func(t tb) {
			b := s.open(t)
			for _, step := range balancerSteps() {
				b.Update(step.set)
				balancerRotation(t, b, step.set, " after "+step.what)
			}
		})
	case SpreadWeighted:
		t.Run("Weighted", func(t tb) {
			b := s.open(t)
			set := balancerWeighted()
			b.Update(set)
			counts := make(map[string]int)
			info := balancerInfo()
			for range balancerWeightedPicks {
				counts[balancerPick(t, b, info, set, "").ID]++
			}
			balancerCheckShares(t, counts, set, s.cfg, "")
		})
		t.Run("Updates", func(t tb) {
			b := s.open(t)
			info := balancerInfo()
			for _, step := range balancerWeightedSteps() {
				b.Update(step.set)
				counts := make(map[string]int)
				for range balancerWeightedPicks {
					counts[balancerPick(t, b, info, step.set, "after "+step.what).ID]++
				}
				balancerCheckShares(t, counts, step.set, s.cfg, " after "+step.what)
			}
		})
	default:
		t.Fatalf("BalancerConfig.Spread is %s, which the suite does not know", s.cfg.Spread)
	}
}

// balancerRotation checks exact rotation over set, which b was just given:
// the first n picks are the n instances, and each later pick is the one n
// picks before it.
func balancerRotation(t tb, b kernel.Balancer, set []kernel.Instance, when string) {
	t.Helper()
	n := len(set)
	info := balancerInfo()
	picks := make([]string, 20*n)
	seen := make(map[string]int)
	for i := range picks {
		picks[i] = balancerPick(t, b, info, set, strings.TrimSpace(when)).ID
		if i < n {
			if j, dup := seen[picks[i]]; dup {
				t.Fatalf("picks %d and %d over %d instances%s both went to %s; round-robin picks each instance once in every %d picks (picks so far: %v)",
					j, i, n, when, picks[i], n, picks[:i+1])
			}
			seen[picks[i]] = i
			continue
		}
		if picks[i] != picks[i-n] {
			t.Fatalf("pick %d went to %s, pick %d to %s; round-robin over %d instances%s repeats every %d picks (picks so far: %v)",
				i, picks[i], i-n, picks[i-n], n, when, n, picks[:i+1])
		}
	}
}

// balancerWeightedSteps is a run of weighted sets: the same IDs with their
// weights changed, a smaller set, a larger one.
func balancerWeightedSteps() []balancerStep {
	weighted := func(prefix string, weights ...string) []kernel.Instance {
		set := balancerSet(prefix, len(weights))
		for i, w := range weights {
			set[i].Metadata = map[string]string{"weight": w}
		}
		return set
	}
	return []balancerStep{
		{weighted("w", "1", "2", "5"), "a set weighted 1, 2, 5"},
		{weighted("w", "5", "2", "1"), "Update to the same instances weighted 5, 2, 1"},
		{weighted("w", "3", "1"), "Update to two of them weighted 3, 1"},
		{weighted("w", "1", "1", "2", "4"), "Update to four weighted 1, 1, 2, 4"},
	}
}

func (s balancerRun) concurrentPicksAndUpdates(t tb) {
	const pickers, picksEach = 4, 2000
	b := s.open(t)
	sets := [][]kernel.Instance{balancerSet("x", 1), balancerSet("y", 3), balancerSet("z", 8)}
	known := make(map[string]kernel.Instance)
	for _, set := range sets {
		for _, in := range set {
			known[in.ID] = in
		}
	}
	b.Update(sets[0])
	obs, _ := b.(kernel.PickObserver)
	// Every goroutine waits for start, so that they all overlap.
	start, stop := make(chan struct{}), make(chan struct{})
	var updater sync.WaitGroup
	registryGo(&updater, t, func() {
		<-start
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b.Update(sets[i%len(sets)])
			runtime.Gosched() // let picks land on each set
		}
	})
	var wg sync.WaitGroup
	for range pickers {
		registryGo(&wg, t, func() {
			<-start
			for range picksEach {
				inst, err := b.Pick(t.Context(), s.info())
				if err != nil {
					t.Errorf("Pick while another goroutine calls Update: %v; every set given was non-empty", err)
					return
				}
				if want, ok := known[balancerID(inst)]; !ok || !balancerSame(inst, &want) {
					t.Errorf("Pick while another goroutine calls Update returned %s, which is no instance of the sets given to Update, unchanged",
						balancerFormat(inst))
					return
				}
				if obs != nil {
					obs.Done(inst, nil)
				}
				// Yield, so that Updates land between picks even when
				// there are fewer cores than goroutines.
				runtime.Gosched()
			}
		})
	}
	close(start)
	wg.Wait()
	close(stop)
	updater.Wait()
}

func (s balancerRun) concurrentSpread(t tb) {
	const pickers = 4
	var set []kernel.Instance
	var picksEach int
	switch s.cfg.Spread {
	case SpreadAny:
		t.Skipf("BalancerConfig.Spread is SpreadAny: the balancer promises only to pick from the current set")
	case SpreadRoundRobin:
		// As many picks as instances: each instance exactly once. A turn
		// lost or taken twice shows as an instance picked twice, whatever
		// the pattern of the losses.
		set, picksEach = balancerSet("rr", 1000), 1000/pickers
	case SpreadWeighted:
		set, picksEach = balancerWeighted(), balancerWeightedPicks/pickers
	default:
		t.Fatalf("BalancerConfig.Spread is %s, which the suite does not know", s.cfg.Spread)
	}
	b := s.open(t)
	b.Update(set)
	obs, _ := b.(kernel.PickObserver)
	counts := make([]map[string]int, pickers)
	start := make(chan struct{}) // so that the pickers overlap
	var wg sync.WaitGroup
	for g := range pickers {
		counts[g] = make(map[string]int)
		registryGo(&wg, t, func() {
			<-start
			info := balancerInfo()
			for range picksEach {
				inst, err := b.Pick(t.Context(), info)
				if err != nil {
					t.Errorf("concurrent Pick: %v", err)
					return
				}
				counts[g][balancerID(inst)]++
				if obs != nil {
					obs.Done(inst, nil)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	total := make(map[string]int)
	for _, c := range counts {
		for id, n := range c {
			total[id] += n
		}
	}
	balancerCheckShares(t, total, set, s.cfg, fmt.Sprintf(" from %d goroutines at once", pickers))
}

func (s balancerRun) observer(t tb) (kernel.Balancer, kernel.PickObserver) {
	b := s.open(t)
	obs, ok := b.(kernel.PickObserver)
	if !ok {
		t.Skipf("the balancer does not implement kernel.PickObserver")
	}
	return b, obs
}

func (s balancerRun) observerDone(t tb) {
	b, obs := s.observer(t)
	set := balancerSet("a", 3)
	b.Update(set)
	info := balancerInfo()
	outcomes := []error{nil, errors.New("plugintest: the call failed"), context.DeadlineExceeded, context.Canceled}
	for i := range 4 * len(outcomes) {
		obs.Done(balancerPick(t, b, info, set, ""), outcomes[i%len(outcomes)])
	}
	// Calls overlap: several picks are out before the first ends.
	var out []*kernel.Instance
	for range 2 * len(set) {
		out = append(out, balancerPick(t, b, info, set, "with calls in flight"))
	}
	for i, inst := range out {
		obs.Done(inst, outcomes[i%len(outcomes)])
	}
	balancerPick(t, b, info, set, "after Done was called for every pick")
}

func (s balancerRun) observerDoneAfterUpdate(t tb) {
	b, obs := s.observer(t)
	old, current := balancerSet("old", 3), balancerSet("new", 2)
	b.Update(old)
	info := balancerInfo()
	var out []*kernel.Instance
	for range 2 * len(old) {
		out = append(out, balancerPick(t, b, info, old, ""))
	}
	// The calls end after the set changed, as they do when the registry
	// reports a change while calls are in flight.
	b.Update(current)
	for i, inst := range out {
		if i%2 == 0 {
			obs.Done(inst, nil)
		} else {
			obs.Done(inst, errors.New("plugintest: the call failed"))
		}
	}
	for range 2 * len(current) {
		obs.Done(balancerPick(t, b, info, current, "after Done for instances of the replaced set"), nil)
	}
}

// balancerWeightedPicks is enough picks for a fair weighted random choice
// to land within the default tolerance: the rarest instance (weight 1 of
// 8) expects 2500 picks, with a standard deviation near 47, and 10% of
// 2500 is over 5 of them.
const balancerWeightedPicks = 20000
