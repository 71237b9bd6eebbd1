// Package roundrobin is the round-robin balancer, kernrpc's default: each
// call goes to the next instance of the current set, in the order the
// registry lists them. Each balancer (one per target service) starts at a
// random position, so that many clients do not all begin on the first
// instance.
//
// Config name: "round-robin". It takes no options:
//
//	balancer: {name: round-robin}
package roundrobin

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the balancer's config name.
const Name = "round-robin"

// Factory builds round-robin balancers; it is registered from init.
var Factory = kernel.Factory[kernel.Balancer]{
	Name: Name,
	Doc:  "each call to the next instance in turn; the default balancer",
	New:  func(any) (kernel.Balancer, error) { return New(), nil },
}

func init() { kernel.RegisterBalancer(Factory) }

var _ kernel.Balancer = (*Balancer)(nil)

// Balancer picks instances in turn. Pick and Update are safe to call
// concurrently; Pick takes no lock and does not allocate.
type Balancer struct {
	instances atomic.Pointer[[]kernel.Instance]
	next      atomic.Uint64 // the pick count; the instance is next % len
}

// New returns a balancer with no instances, starting at a random position.
func New() *Balancer {
	b := &Balancer{}
	b.next.Store(uint64(rand.Uint32())) // far from wrapping around, which would skip a turn
	return b
}

// Update replaces the set picks are made from. The balancer keeps
// instances; the caller must not change it afterwards.
func (b *Balancer) Update(instances []kernel.Instance) {
	b.instances.Store(&instances)
}

// Pick returns a pointer into the current set: the instance after the one
// the previous Pick returned. With no instances it returns an error wrapping
// kernel.ErrNoInstances.
func (b *Balancer) Pick(_ context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	p := b.instances.Load()
	if p == nil || len(*p) == 0 {
		return nil, noInstances(info)
	}
	set := *p
	n := b.next.Add(1) - 1
	return &set[n%uint64(len(set))], nil
}

func noInstances(info *kernel.CallInfo) error {
	method := "(unknown method)"
	if info != nil && info.Method != "" {
		method = info.Method
	}
	return fmt.Errorf("round-robin: call %s: %w: the registry lists no instance of the service; "+
		"check that a server registered it and that this client's registry sees it "+
		"(same registry plugin and namespace, or a static entry)", method, kernel.ErrNoInstances)
}
