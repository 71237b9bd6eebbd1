// Package leastload is a balancer that sends each call to the less loaded
// of two instances picked at random ("power of two choices"), load being
// the instance's recent latency as this client measured it times one plus
// the calls this client has in flight to it, as Finagle's and Linkerd's
// P2C balancers weigh them. A slow or busy instance gets fewer calls as
// soon as it slows, without any report from it.
//
// Config name: "least-load". Options, with defaults:
//
//	balancer:
//	  name: least-load
//	  options:
//	    decay: 10s   # time constant of the latency average; more than 0
//	    peak: false  # true: a slower call replaces the average at once (peak EWMA)
//
// # Load
//
// The latency of an instance is a moving average of the calls this client
// made to it, from Pick to PickObserver.Done: a call that ends dt after the
// one before weighs 1 - exp(-dt/decay) against the average. The first 64
// calls are averaged alike instead, leaving out the very first once a
// second is in: it dialed the connection, and would otherwise stand for
// the instance for about decay. With no call measured, the average decays
// towards zero with ten times decay as time constant, so that an instance
// judged slow is tried again at length, however idle the others.
//
// With peak: true a call slower than the average replaces it at once, as in
// Finagle's and Linkerd's peak EWMA, which suits networks whose slowdowns
// last. It is off by default because it follows every hiccup: in this
// package's test of one instance five times slower than two others, on a
// loaded 2-core machine, peak EWMA sent it 4–12% of the calls (the fast
// instances' scheduling stalls made them look as slow), the plain average
// 0.1–0.5% in most runs.
//
// Calls cancelled by their caller (a hedge's slower attempt among them)
// and picks an attempt filter refused (kernel.ErrInstanceRefused) end their
// in-flight count but tell nothing of the latency; failed calls count as any other (pair the balancer with the
// breaker filter for instances that fail fast).
//
// An instance this client has not called yet has no latency of its own:
// the balancer uses the load it reports (kernel.Instance.Load, its
// in-flight calls over its recent calls per second, by Little's law), and
// without a report the latency of the other instance of the pair, so that
// the two compare by in-flight calls alone. State is kept by instance ID
// and address across Updates, and dropped for instances that leave the
// set: two instances listed under one ID at different addresses (Consul
// lists a service another program registered on several nodes under one
// ID) are two servers, each picked and judged on its own.
//
// Pick takes no lock and does not allocate: each instance keeps 64 slots
// for the start times of its calls in flight, and Pick returns a copy of
// the instance held in a free slot (unchanged, as kernel.Balancer requires,
// and never written again), by which Done finds the call's start. A 65th
// call in flight to one instance is counted but not timed; so is, from
// then on, a call still out when its instance has changed twice (a load
// report changes it), whose slot is then retired.
package leastload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the balancer's config name.
const Name = "least-load"

// Options configure the balancer.
type Options struct {
	// Decay is the time constant of the latency average: a sample dt old
	// has weight exp(-dt/decay).
	Decay kernel.Duration `json:"decay"`
	// Peak makes a call slower than the average replace it at once, as
	// Finagle's and Linkerd's peak EWMA do, instead of entering it with
	// its weight.
	Peak bool `json:"peak"`
}

// DefaultOptions returns the options a config without an options block
// gets: Finagle's and Linkerd's 10s.
func DefaultOptions() *Options {
	return &Options{Decay: kernel.Duration(10 * time.Second)}
}

// Factory builds least-load balancers; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"the less loaded of two random instances, by measured latency and calls in flight",
	DefaultOptions,
	func(o *Options) (kernel.Balancer, error) { return New(*o) })

func init() { kernel.RegisterBalancer(Factory) }

var (
	_ kernel.Balancer     = (*Balancer)(nil)
	_ kernel.PickObserver = (*Balancer)(nil)
)

// Balancer picks by power of two choices over measured load. Pick, Done
// and Update are safe to call concurrently; Pick and Done take no lock
// shared between instances, and neither allocates.
type Balancer struct {
	decay float64 // ns
	peak  bool
	epoch time.Time

	mu    sync.Mutex // serializes Updates
	table atomic.Pointer[table]
}

// table is one set and the state of each of its instances; never written
// once stored (the peers' counters change, not the table).
type table struct {
	set   []kernel.Instance
	peers []*peer // peers[i] is set[i]'s
	byKey map[peerKey]*peer
}

// peerKey names an instance's state: its ID alone would merge instances
// listed under one ID at different addresses, and every pick of them would
// go to the first one's address (a peer's slots hold its first instance).
type peerKey struct{ id, address string }

func keyOf(in *kernel.Instance) peerKey { return peerKey{in.ID, in.Address} }

// New builds a balancer from o, refusing a decay that is not positive.
func New(o Options) (*Balancer, error) {
	if o.Decay <= 0 {
		return nil, fmt.Errorf(`option "decay": %s is not a positive duration`, o.Decay)
	}
	return &Balancer{decay: float64(o.Decay.D()), peak: o.Peak, epoch: time.Now()}, nil
}

// now is the time since the balancer was built, in ns, at least 1: 0 means
// "never" in a peer's stamp.
func (b *Balancer) now() int64 { return int64(time.Since(b.epoch)) + 1 }

// Update replaces the set picks are made from, keeping the state of the
// instances that remain (by ID and address). The balancer keeps
// instances; the caller must not change it afterwards.
func (b *Balancer) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.table.Load()
	t := &table{set: instances, peers: make([]*peer, len(instances)), byKey: make(map[peerKey]*peer, len(instances))}
	for i := range instances {
		in := &instances[i]
		p := t.byKey[keyOf(in)] // an instance listed twice shares its state
		if p == nil {
			if old != nil {
				p = old.byKey[keyOf(in)]
			}
			if p == nil {
				p = newPeer(in)
			} else {
				p.refresh(in)
			}
			t.byKey[keyOf(in)] = p
		}
		t.peers[i] = p
	}
	b.table.Store(t)
}

// Pick returns the less loaded of two instances of the current set picked
// at random (the one instance of a set of one). With no instances it
// returns an error wrapping kernel.ErrNoInstances.
func (b *Balancer) Pick(_ context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	t := b.table.Load()
	if t == nil || len(t.set) == 0 {
		return nil, noInstances(info)
	}
	now := b.now()
	i := 0
	if n := len(t.set); n > 1 {
		i = rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		if b.lighter(t, j, i, now) {
			i = j
		}
	}
	return t.peers[i].start(&t.set[i], now), nil
}

// lighter reports whether set[j] is less loaded than set[i].
func (b *Balancer) lighter(t *table, j, i int, now int64) bool {
	li, iok := t.peers[i].latency(now, b.decay)
	lj, jok := t.peers[j].latency(now, b.decay)
	if !iok {
		li, iok = reported(&t.set[i])
	}
	if !jok {
		lj, jok = reported(&t.set[j])
	}
	switch {
	case !iok && !jok:
		li, lj = 1, 1
	case !iok:
		li = lj
	case !jok:
		lj = li
	}
	return lj*float64(t.peers[j].inflight.Load()+1) < li*float64(t.peers[i].inflight.Load()+1)
}

// reported estimates an instance's latency from the load it reports: by
// Little's law, calls in flight over calls per second (at least one call in
// flight, so that an idle instance still has a latency).
func reported(in *kernel.Instance) (float64, bool) {
	if in.Load.QPS <= 0 || math.IsInf(in.Load.QPS, 0) || math.IsNaN(in.Load.QPS) {
		return 0, false
	}
	return float64(max(in.Load.InFlight, 1)) / in.Load.QPS * 1e9, true
}

// Done ends the in-flight call inst was picked for and, unless the call
// was cancelled or never sent, takes its latency into the instance's
// average. An instance that left the set since is ignored: its state is
// gone.
func (b *Balancer) Done(inst *kernel.Instance, err error) {
	t := b.table.Load()
	if t == nil || inst == nil {
		return
	}
	p := t.byKey[keyOf(inst)]
	if p == nil {
		return
	}
	now := b.now()
	started, timed := p.end(inst)
	if timed && sampled(err) {
		p.observe(float64(now-started), now, b.decay, b.peak)
	}
}

// sampled reports whether a call that ended with err says how fast the
// instance is: not when its caller cancelled it, nor when an attempt
// filter refused the pick and nothing was sent.
func sampled(err error) bool {
	return err == nil || !(errors.Is(err, context.Canceled) || errors.Is(err, kernel.ErrInstanceRefused) ||
		kernel.CodeOf(err) == kernel.Canceled)
}

func noInstances(info *kernel.CallInfo) error {
	method := "(unknown method)"
	if info != nil && info.Method != "" {
		method = info.Method
	}
	return fmt.Errorf("least-load: call %s: %w: the registry lists no instance of the service; "+
		"check that a server registered it and that this client's registry sees it", method, kernel.ErrNoInstances)
}

const (
	// warmCalls are averaged alike before the weight by time takes over,
	// leaving out the first, which carried the dial of the connection and
	// would otherwise stand for the instance for about decay.
	warmCalls = 64
	// forgetting is how many times decay an instance's average takes, with
	// no call measured, to fall by a factor e: so that an instance judged
	// slow is tried again, at length, even when the others are never busy
	// enough to send it a call.
	forgetting = 10
)

// slotCount is how many calls in flight to one instance are timed; one
// word of busy bits.
const slotCount = 64

// peer is the state of one instance, by ID and address, kept across Updates.
type peer struct {
	inflight atomic.Int64 // calls picked and not yet Done, timed or not
	untimed  atomic.Int64 // of those, the ones that found no free slot

	// cost is the latency average in ns (float64 bits) as of stamp (ns
	// since the balancer's epoch; 0: no call measured yet). mu serializes
	// their writers; readers take them without it, and a reader that sees
	// a new cost with an old stamp merely decays it a little too much.
	mu      sync.Mutex
	samples int // calls measured, up to warmCalls
	cost    atomic.Uint64
	stamp   atomic.Int64

	// calls holds the slots picks are handed out from, copies of the
	// instance as the current set lists it; prev, those of the version
	// before, whose calls may still be in flight.
	calls, prev atomic.Pointer[callSlots]
}

// callSlots are the slots of one version of an instance. insts are never
// written after newSlots: a pick points into them.
type callSlots struct {
	insts [slotCount]kernel.Instance
	busy  atomic.Uint64 // bit k: insts[k] is out, started at start[k]
	start [slotCount]atomic.Int64
	// retired is set, before busy is cleared, when the calls still out
	// in these slots are moved to the peer's untimed ones.
	retired atomic.Bool
}

func newPeer(in *kernel.Instance) *peer {
	p := &peer{}
	p.calls.Store(newSlots(in))
	return p
}

func newSlots(in *kernel.Instance) *callSlots {
	s := &callSlots{}
	for k := range s.insts {
		s.insts[k] = *in
	}
	return s
}

// refresh makes in the instance picks return, if it changed. The slots of
// the version before last are retired: the calls still out in them stay in
// flight, untimed from then on, and the Done of each, which no longer
// finds its slot, ends one untimed call. (An instance changes at each of
// its load reports, every load_report_interval while it is busy: calls
// that outlast two of them must still weigh against it.)
func (p *peer) refresh(in *kernel.Instance) {
	cur := p.calls.Load()
	if sameInstance(&cur.insts[0], in) {
		return
	}
	// Under mu, which a Done that finds its call's slots neither in calls
	// nor in prev waits for before it ends an untimed call: by then they
	// are counted among them. cur goes to prev before calls moves on, so
	// that a Done, which loads calls then prev, cannot miss it.
	p.mu.Lock()
	defer p.mu.Unlock()
	if retired := p.prev.Swap(cur); retired != nil {
		retired.retired.Store(true)
		p.untimed.Add(int64(bits.OnesCount64(retired.busy.Swap(0))))
	}
	p.calls.Store(newSlots(in))
}

func sameInstance(a, b *kernel.Instance) bool {
	if a.Service != b.Service || a.ID != b.ID || a.Address != b.Address || len(a.Metadata) != len(b.Metadata) ||
		a.Load.InFlight != b.Load.InFlight || a.Load.QPS != b.Load.QPS || !a.Load.Updated.Equal(b.Load.Updated) {
		return false
	}
	for k, v := range a.Metadata {
		if w, ok := b.Metadata[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// start counts a call to the peer and returns the instance it goes to: a
// free slot's copy, with the start time in it, or, with every slot out,
// listed (untimed).
func (p *peer) start(listed *kernel.Instance, now int64) *kernel.Instance {
	p.inflight.Add(1)
	for {
		s := p.calls.Load()
		busy := s.busy.Load()
		if busy == math.MaxUint64 {
			p.untimed.Add(1)
			return listed
		}
		k := bits.TrailingZeros64(^busy)
		if !s.busy.CompareAndSwap(busy, busy|1<<k) {
			continue
		}
		if s.retired.Load() && s.release(k) {
			// Two refreshes retired these slots since the Load above,
			// and the second did not count this call among the
			// untimed ones: take a slot of the current version. (Had
			// it counted it, release fails: the call is untimed, and
			// its Done ends it as such.)
			continue
		}
		s.start[k].Store(now)
		return &s.insts[k]
	}
}

// end ends the call picked as inst and returns when it started, if it was
// timed.
func (p *peer) end(inst *kernel.Instance) (started int64, timed bool) {
search:
	for _, s := range [2]*callSlots{p.calls.Load(), p.prev.Load()} {
		if s == nil {
			continue
		}
		for k := range s.insts {
			if &s.insts[k] != inst {
				continue
			}
			started = s.start[k].Load()
			if s.release(k) {
				p.inflight.Add(-1)
				return started, true
			}
			if !s.retired.Load() {
				return 0, false // a second Done of the call: ended already
			}
			break search // retired meanwhile: the call is untimed now
		}
	}
	// An untimed call, or one of slots retired since: end one untimed
	// call if there is one.
	for waited := false; ; {
		n := p.untimed.Load()
		if n <= 0 && !waited {
			// A refresh retiring this call's slots holds mu until it
			// has counted the call among the untimed ones.
			p.mu.Lock()
			n = p.untimed.Load()
			p.mu.Unlock()
			waited = true
		}
		if n <= 0 {
			return 0, false
		}
		if p.untimed.CompareAndSwap(n, n-1) {
			p.inflight.Add(-1)
			return 0, false
		}
	}
}

// release frees slot k, reporting false if it was not out (its slots were
// retired).
func (s *callSlots) release(k int) bool {
	bit := uint64(1) << k
	for {
		busy := s.busy.Load()
		if busy&bit == 0 {
			return false
		}
		if s.busy.CompareAndSwap(busy, busy&^bit) {
			return true
		}
	}
}

// latency returns the peer's latency average decayed to now, and false if
// no call of it was measured yet.
func (p *peer) latency(now int64, decay float64) (float64, bool) {
	stamp := p.stamp.Load()
	if stamp == 0 {
		return 0, false
	}
	cost := math.Float64frombits(p.cost.Load())
	return cost * expNeg(float64(max(now-stamp, 0))/(forgetting*decay)), true
}

// observe takes one call's latency rtt (ns), measured at now, into the
// average, weighed by the time since the last one, or alike with the others
// of the first warmCalls; with peak, a slower call after those replaces the
// average.
func (p *peer) observe(rtt float64, now int64, decay float64, peak bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	stamp := p.stamp.Load()
	cost := math.Float64frombits(p.cost.Load())
	a := 1 - expNeg(float64(max(now-stamp, 0))/decay)
	if p.samples < warmCalls {
		// The first call stands alone until the second replaces it; then
		// the calls since are averaged alike.
		p.samples++
		a = max(a, 1/float64(max(p.samples-1, 1)))
	} else if peak && rtt > cost {
		a = 1
	}
	cost += a * (rtt - cost)
	p.cost.Store(math.Float64bits(cost))
	p.stamp.Store(max(now, stamp))
}

// expNeg is exp(-x) for x >= 0. Between calls x is usually tiny (µs over
// seconds), where four terms of the series are exact to 1e-9 and cost a
// tenth of math.Exp, which Pick would otherwise call twice.
func expNeg(x float64) float64 {
	if x < 0.01 {
		return 1 - x*(1-x*(0.5-x*(1.0/6)))
	}
	return math.Exp(-x)
}
