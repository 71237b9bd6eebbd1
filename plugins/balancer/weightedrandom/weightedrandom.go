// Package weightedrandom is a balancer that picks each instance at random
// with a probability proportional to its weight, read from the instance's
// metadata on every Update: a registry that changes an instance's weight
// moves its share of the calls at the next Update.
//
// Config name: "weighted-random". Options, with defaults:
//
//	balancer:
//	  name: weighted-random
//	  options:
//	    weight_key: weight   # the instance metadata key holding the weight
//	    default_weight: 1    # the weight of an instance without one
//
// A weight is a decimal integer from 0 to 2147483647. Weight 0 takes the
// instance out of rotation while another instance has a positive weight
// (drain it); when every weight is 0, picks are uniform, since a set of
// instances is better than none. A weight that is not such an integer
// ("heavy", "-3", "1.5") counts as default_weight, and the balancer logs it
// once at WARN for each instance, by ID and address (again only after it
// changed, or was fixed and broke anew), so that a typo in one
// registration neither takes an instance out nor fails calls.
//
// Pick takes no lock and does not allocate: Update builds an immutable
// table of cumulative weights behind an atomic pointer, and Pick draws a
// random number and finds its instance by binary search, O(log n).
package weightedrandom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the balancer's config name.
const Name = "weighted-random"

// Options configure the balancer.
type Options struct {
	// WeightKey is the instance metadata key the weight is read from.
	WeightKey string `json:"weight_key"`
	// DefaultWeight is the weight of an instance whose metadata has none,
	// or has one that is not an integer from 0 to 2147483647.
	DefaultWeight int `json:"default_weight"`
	// Logger receives the warning about a malformed weight; nil means
	// slog.Default(). Code only: config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{WeightKey: "weight", DefaultWeight: 1}
}

// Factory builds weighted-random balancers; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"random picks in proportion to each instance's metadata weight",
	DefaultOptions,
	func(o *Options) (kernel.Balancer, error) { return New(*o) })

func init() { kernel.RegisterBalancer(Factory) }

var _ kernel.Balancer = (*Balancer)(nil)

// maxWeight bounds a weight, so that the total of any set fits a uint64.
const maxWeight = 1<<31 - 1

// Balancer picks at random by weight. Pick and Update are safe to call
// concurrently; Pick takes no lock and does not allocate.
type Balancer struct {
	key           string
	defaultWeight uint64
	log           *slog.Logger

	table atomic.Pointer[table]

	// mu serializes Updates, and guards warned: the malformed weights
	// already logged, by instance ID and address, kept only while they
	// stay malformed. (An ID listed at several addresses, as Consul lists
	// a service another program registered on several nodes, is several
	// servers, each with its own weight.)
	mu     sync.Mutex
	warned map[instanceKey]string
}

// instanceKey names one instance of a set for the warnings.
type instanceKey struct{ id, address string }

// table is one set with its cumulative weights; never written once stored.
type table struct {
	set []kernel.Instance
	// cum[i] is the total weight of set[:i+1]; a pick draws r below
	// cum[len-1] and takes the first i with r < cum[i].
	cum []uint64
}

// New builds a balancer from o, refusing an empty weight key or a default
// weight outside 0..2147483647.
func New(o Options) (*Balancer, error) {
	if o.WeightKey == "" {
		return nil, errors.New(`option "weight_key": must not be empty`)
	}
	if o.DefaultWeight < 0 || o.DefaultWeight > maxWeight {
		return nil, fmt.Errorf(`option "default_weight": %d is outside 0..%d`, o.DefaultWeight, maxWeight)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Balancer{key: o.WeightKey, defaultWeight: uint64(o.DefaultWeight), log: log, warned: map[instanceKey]string{}}, nil
}

// Update replaces the set picks are made from, reading every instance's
// weight anew. The balancer keeps instances; the caller must not change it
// afterwards.
func (b *Balancer) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := &table{set: instances, cum: make([]uint64, len(instances))}
	var total uint64
	bad := make(map[instanceKey]string)
	for i := range instances {
		w, ok := b.weight(&instances[i])
		if !ok {
			in := &instances[i]
			raw := in.Metadata[b.key]
			k := instanceKey{in.ID, in.Address}
			bad[k] = raw
			if prev, seen := b.warned[k]; !seen || prev != raw {
				b.log.Warn("weighted-random: malformed instance weight; using default_weight",
					"service", in.Service, "instance", in.ID, "address", in.Address, "key", b.key, "value", raw, "default_weight", b.defaultWeight)
			}
		}
		total += w
		t.cum[i] = total
	}
	if total == 0 { // every weight 0: uniform rather than nothing
		for i := range t.cum {
			t.cum[i] = uint64(i + 1)
		}
	}
	b.warned = bad
	b.table.Store(t)
}

// weight reads in's weight; ok is false when it is present but malformed.
func (b *Balancer) weight(in *kernel.Instance) (w uint64, ok bool) {
	raw, present := in.Metadata[b.key]
	if !present {
		return b.defaultWeight, true
	}
	n, err := strconv.ParseUint(raw, 10, 31)
	if err != nil {
		return b.defaultWeight, false
	}
	return n, true
}

// Pick returns a pointer into the current set, each instance with a
// probability of its weight over the total. With no instances it returns an
// error wrapping kernel.ErrNoInstances.
func (b *Balancer) Pick(_ context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	t := b.table.Load()
	if t == nil || len(t.set) == 0 {
		return nil, noInstances(info)
	}
	r := rand.Uint64N(t.cum[len(t.cum)-1])
	lo, hi := 0, len(t.cum)-1 // the answer is in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r < t.cum[mid] {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return &t.set[lo], nil
}

func noInstances(info *kernel.CallInfo) error {
	method := "(unknown method)"
	if info != nil && info.Method != "" {
		method = info.Method
	}
	return fmt.Errorf("weighted-random: call %s: %w: the registry lists no instance of the service; "+
		"check that a server registered it and that this client's registry sees it", method, kernel.ErrNoInstances)
}
