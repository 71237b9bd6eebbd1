package bufpool

import (
	"runtime"
	"sync"
	"time"
	"weak"
)

// Trimming. A free list keeps what its busiest moment had out, up to its
// limit, and without trimming it would keep that for good: a server that
// once answered a burst of large calls would hold those buffers, tens of
// MiB, through every quiet hour after. So each Pool gives back, at most
// once per trimInterval and at the end of a GC cycle, the buffers it had
// no use for during the whole interval: those below the fewest it held
// since the last trim. Steady traffic dips into its free lists and keeps
// them; a burst's buffers go back to the collector a second or so after
// the burst. A process that does not collect (GOGC=off) never trims.
//
// The trimmer is process-wide, as sync.Pool's cleanup is: one cleanup a GC
// cycle walks every live Pool, rather than one cleanup per Pool (per
// connection) every cycle.

// trimInterval is the least time between two trims; a variable so that
// tests can make every cycle trim (under trimmer.mu).
var trimInterval = time.Second

// trimmer holds weak references to every Pool New made and trims them
// after GC cycles.
var trimmer struct {
	mu    sync.Mutex
	pools []weak.Pointer[Pool]
	armed bool      // a sentinel waits for the next cycle
	last  time.Time // the last trim
}

// sentinel is collected at the end of the GC cycle after it is made, which
// runs its cleanup. It has a pointer so that it is not a tiny allocation,
// whose cleanup could wait for its neighbours.
type sentinel struct{ _ *byte }

// autoTrim has p trimmed for as long as it is reachable.
func autoTrim(p *Pool) {
	trimmer.mu.Lock()
	defer trimmer.mu.Unlock()
	trimmer.pools = append(trimmer.pools, weak.Make(p))
	if !trimmer.armed {
		trimmer.armed = true
		armSentinel()
	}
}

func armSentinel() {
	runtime.AddCleanup(&sentinel{}, func(struct{}) { afterGC() }, struct{}{})
}

// afterGC trims every live Pool if trimInterval has passed since the last
// trim, forgets the collected ones, and waits for the next cycle while any
// Pool is left. It trims with the list taken out of the trimmer, so that
// the Pools that connections make meanwhile do not wait for it.
func afterGC() {
	trimmer.mu.Lock()
	now := time.Now()
	if now.Sub(trimmer.last) < trimInterval {
		armSentinel()
		trimmer.mu.Unlock()
		return
	}
	trimmer.last = now
	pools := trimmer.pools
	trimmer.pools = nil
	trimmer.mu.Unlock()

	live := pools[:0]
	for _, w := range pools {
		if p := w.Value(); p != nil {
			p.trim()
			live = append(live, w)
		}
	}
	clear(pools[len(live):])

	trimmer.mu.Lock()
	defer trimmer.mu.Unlock()
	trimmer.pools = append(live, trimmer.pools...)
	trimmer.armed = len(trimmer.pools) > 0
	if trimmer.armed {
		armSentinel()
	}
}

// trim drops, from each class, the buffers it did not need since the last
// trim.
func (p *Pool) trim() {
	for k := range p.classes {
		p.classes[k].trim()
	}
}

// trim drops the values the list did not need since the last trim: as
// many as the fewest it held meanwhile, the oldest first. A list that
// served steady traffic, dipping to empty now and then, keeps what it has.
func (l *FreeList[T]) trim() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if drop := l.low; drop > 0 {
		n := copy(l.items, l.items[drop:])
		clear(l.items[n:])
		l.items = l.items[:n]
	}
	l.low = len(l.items)
}
