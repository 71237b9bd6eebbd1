// Package consistenthash is a balancer that sends every call with the same
// key to the same instance: the key is a call metadata entry, and the
// instances sit on a hash ring, each at many points (virtual nodes), so
// that adding or removing one instance of N moves about 1/N of the keys,
// and only to or from that instance.
//
// Config name: "consistent-hash". Options, with defaults:
//
//	balancer:
//	  name: consistent-hash
//	  options:
//	    key: x-hash-key    # the call metadata entry hashed
//	    replicas: 160      # points on the ring per instance, 1..10000
//	    fallback: error    # a call without the key: error, or random
//
// A call sets its key with kernrpc.WithMetadata(ctx, kernel.Metadata{"x-hash-key": userID}).
// A call without the entry, or with an empty one, fails with
// InvalidArgument naming the key, before any instance is picked; with
// fallback: random it goes to an instance picked uniformly at random.
//
// # The ring
//
// Every client computes the same ring from the same set, whatever order the
// registry lists it in and whichever process or version of kernrpc it runs,
// so that clients of one service agree on where a key goes. The hash is
// 64-bit FNV-1a followed by the SplitMix64 finalizer (mix below), both
// written out here and pinned by a test: instance ID's point r (0 ≤ r <
// replicas) is at mix(fnv1a(ID) + (r+1)·0x9E3779B97F4A7C15), a key at
// mix(fnv1a(key)), and a key goes to the first point at or after its hash,
// wrapping around; points at the same place are ordered by ID, then
// address. An ID the set lists at more than one address (Consul lists a
// service another program registered on several nodes under one ID) names
// several servers: each of them hashes as its ID, a zero byte and its
// address instead, so that each owns keys of its own.
//
// Pick takes no lock and does not allocate: Update builds the ring behind
// an atomic pointer, and Pick hashes the key and searches the ring.
package consistenthash

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the balancer's config name.
const Name = "consistent-hash"

// Fallback values.
const (
	FallbackError  = "error"
	FallbackRandom = "random"
)

// maxReplicas bounds the points per instance, so that a typo does not
// build a ring of millions of points per instance.
const maxReplicas = 10000

// Options configure the balancer.
type Options struct {
	// Key is the call metadata entry hashed.
	Key string `json:"key"`
	// Replicas is the number of points each instance has on the ring: more
	// spread keys more evenly at the cost of a larger ring (16 bytes a
	// point). With 160, instances' shares spread about 1/N by some 6-9%
	// (one standard deviation); the extremes grow with N: among 50
	// instances numbered alike, from 0.74/N to 1.17/N.
	Replicas int `json:"replicas"`
	// Fallback is what a call without the key gets: "error"
	// (InvalidArgument naming the key) or "random" (a uniform random pick).
	Fallback string `json:"fallback"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Key: "x-hash-key", Replicas: 160, Fallback: FallbackError}
}

// Factory builds consistent-hash balancers; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"the same call metadata key to the same instance, on a ring of virtual nodes",
	DefaultOptions,
	func(o *Options) (kernel.Balancer, error) { return New(*o) })

func init() { kernel.RegisterBalancer(Factory) }

var _ kernel.Balancer = (*Balancer)(nil)

// Balancer picks by the hash of a call's key. Pick and Update are safe to
// call concurrently; Pick takes no lock and does not allocate.
type Balancer struct {
	key      string
	replicas int
	random   bool
	ring     atomic.Pointer[ring]
}

// ring is one set and its points sorted by hash; never written once stored.
type ring struct {
	set    []kernel.Instance
	points []point
}

// point is one place on the ring, owned by set[inst].
type point struct {
	hash uint64
	inst int32
}

// New builds a balancer from o, refusing an empty key, a replica count
// outside 1..10000 or an unknown fallback.
func New(o Options) (*Balancer, error) {
	if o.Key == "" {
		return nil, errors.New(`option "key": must not be empty`)
	}
	if o.Replicas < 1 || o.Replicas > maxReplicas {
		return nil, fmt.Errorf(`option "replicas": %d is outside 1..%d`, o.Replicas, maxReplicas)
	}
	if o.Fallback != FallbackError && o.Fallback != FallbackRandom {
		return nil, fmt.Errorf(`option "fallback": %q is neither %q nor %q`, o.Fallback, FallbackError, FallbackRandom)
	}
	return &Balancer{key: o.Key, replicas: o.Replicas, random: o.Fallback == FallbackRandom}, nil
}

// Update builds the ring of instances. The balancer keeps instances; the
// caller must not change it afterwards.
func (b *Balancer) Update(instances []kernel.Instance) {
	r := &ring{set: instances, points: make([]point, 0, len(instances)*b.replicas)}
	shared := sharedIDs(instances)
	for i := range instances {
		in := &instances[i]
		base := fnv1a(in.ID)
		if shared[in.ID] {
			// Points of their own: with the ID's, they would all tie, and
			// one of them would own every key.
			base = fnv1a(in.ID + "\x00" + in.Address)
		}
		for rep := range b.replicas {
			r.points = append(r.points, point{hash: mix(base + uint64(rep+1)*golden), inst: int32(i)})
		}
	}
	// By ID, then address, among equal hashes, so that the ring does not
	// depend on the order of the set (an instance listed twice ties with
	// itself, which makes no difference).
	slices.SortFunc(r.points, func(a, c point) int {
		if n := cmp.Compare(a.hash, c.hash); n != 0 {
			return n
		}
		x, y := &instances[a.inst], &instances[c.inst]
		if n := cmp.Compare(x.ID, y.ID); n != 0 {
			return n
		}
		return cmp.Compare(x.Address, y.Address)
	})
	b.ring.Store(r)
}

// sharedIDs returns the IDs instances lists at more than one address; nil
// when there are none, as in a set a kernrpc registry reports.
func sharedIDs(instances []kernel.Instance) map[string]bool {
	var shared map[string]bool
	first := make(map[string]string, len(instances)) // ID: an address
	for i := range instances {
		in := &instances[i]
		if a, ok := first[in.ID]; !ok {
			first[in.ID] = in.Address
		} else if a != in.Address {
			if shared == nil {
				shared = make(map[string]bool)
			}
			shared[in.ID] = true
		}
	}
	return shared
}

// Pick returns a pointer into the current set: the owner of the first
// point at or after the hash of the call's key. A call without the key
// fails with InvalidArgument, or goes to a random instance with fallback
// random; with no instances Pick returns an error wrapping
// kernel.ErrNoInstances.
func (b *Balancer) Pick(_ context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	var key string
	if info != nil {
		key = info.Metadata[b.key]
	}
	if key == "" && !b.random {
		return nil, b.missingKey(info)
	}
	r := b.ring.Load()
	if r == nil || len(r.set) == 0 {
		return nil, noInstances(info)
	}
	if key == "" {
		return &r.set[rand.IntN(len(r.set))], nil
	}
	return &r.set[r.owner(mix(fnv1a(key)))], nil
}

// owner returns the index of the instance owning the first point at or
// after h, wrapping around.
func (r *ring) owner(h uint64) int32 {
	lo, hi := 0, len(r.points) // the first point with hash >= h is in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.points[mid].hash < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(r.points) {
		lo = 0
	}
	return r.points[lo].inst
}

func (b *Balancer) missingKey(info *kernel.CallInfo) error {
	return kernel.Errorf(kernel.InvalidArgument,
		"consistent-hash: call %s has no %q metadata entry to hash; set it on the call "+
			"(kernrpc.WithMetadata), or configure the balancer with fallback: random", method(info), b.key)
}

func noInstances(info *kernel.CallInfo) error {
	return fmt.Errorf("consistent-hash: call %s: %w: the registry lists no instance of the service; "+
		"check that a server registered it and that this client's registry sees it", method(info), kernel.ErrNoInstances)
}

func method(info *kernel.CallInfo) string {
	if info != nil && info.Method != "" {
		return info.Method
	}
	return "(unknown method)"
}

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
	golden    = 0x9E3779B97F4A7C15 // 2^64 / φ: spaces the replicas of one ID apart
)

// fnv1a is 64-bit FNV-1a of s, as hash/fnv's New64a computes it, without
// the allocation of a hash.Hash.
func fnv1a(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// mix is SplitMix64's finalizer: FNV-1a of short, similar strings (IDs that
// differ in their last digit) is poorly spread in its high bits, which
// decide a place on the ring.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
