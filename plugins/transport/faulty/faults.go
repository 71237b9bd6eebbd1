package faulty

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// action is what becomes of one frame written.
type action struct {
	swallow  bool // blackholed, stalled or dropped: accepted, never sent
	reset    bool // the connection resets instead of sending it
	dup      bool
	corrupt  bool
	truncate bool
	delay    time.Duration
}

// faults decides, frame by frame, what one connection does to the frames
// written on it. Its generator is the connection's own, so a run with one
// caller per connection is reproduced exactly by its seed.
type faults struct {
	o        *Options
	affected [kernel.FrameWindowUpdate + 1]bool

	mu  sync.Mutex
	rng *rand.Rand
	// at draws where truncate cuts and corrupt flips, and with what. It is
	// a generator of its own because those draws are made only for the
	// frames those faults hit: from rng, they would shift every later
	// frame's draws, and turning truncate on would change which frames
	// drop hits.
	at      *rand.Rand
	n       int // affected frames written so far
	stalled bool
}

func newFaults(o *Options, side, seq uint64) *faults {
	stream := side<<32 | seq
	fs := &faults{o: o, rng: rand.New(rand.NewPCG(o.Seed, stream)), at: rand.New(rand.NewPCG(o.Seed, stream|1<<63))}
	for _, name := range o.Frames {
		fs.affected[frameNames[name]] = true
	}
	return fs
}

func (fs *faults) affects(t kernel.FrameType) bool {
	return int(t) < len(fs.affected) && fs.affected[t]
}

// decide draws the fate of a frame of type t. Every draw is made whether
// or not its fault is on, so that turning one fault on does not change
// which frames the others hit.
func (fs *faults) decide(t kernel.FrameType) action {
	o := fs.o
	if o.Blackhole {
		return action{swallow: true}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.stalled {
		// A writer that stopped stops for every frame, affected or not.
		return action{swallow: true}
	}
	if !fs.affects(t) {
		return action{}
	}
	fs.n++
	var d [6]float64
	for i := range d {
		d[i] = fs.rng.Float64()
	}
	switch {
	case o.ResetAfter > 0 && fs.n > o.ResetAfter, d[0] < o.Reset:
		return action{reset: true}
	case o.StallAfter > 0 && fs.n > o.StallAfter:
		fs.stalled = true
		return action{swallow: true}
	case d[1] < o.Drop:
		return action{swallow: true}
	}
	return action{
		dup:      d[2] < o.Duplicate,
		corrupt:  d[3] < o.Corrupt,
		truncate: d[4] < o.Truncate,
		delay:    o.delay(d[5]),
	}
}

// intN draws from [0, n), for where to cut or flip.
func (fs *faults) intN(n int) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.at.IntN(n)
}

// flip draws a non-zero byte to xor into another.
func (fs *faults) flip() byte {
	return byte(1 + fs.intN(255))
}

// count is how many affected frames were written so far.
func (fs *faults) count() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.n
}
