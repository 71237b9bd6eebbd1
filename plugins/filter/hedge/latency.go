package hedge

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// A latency histogram: buckets exact below 8ns, then 8 per power of two
// (12.5% wide), up to 2^41ns (about 37 minutes); longer goes in the last.
const (
	subBits    = 3
	subCount   = 1 << subBits
	maxExp     = 40
	numBuckets = (maxExp - subBits + 2) * subCount

	// window is how many latencies a window holds: the delay is computed
	// from the current window and the one before, so from the last 1024 to
	// 2048 attempts of the method.
	window = 1024
	// recomputeEvery is how often, in latencies observed, the delay is
	// computed again.
	recomputeEvery = 32
	// minSamples is how many latencies a method needs before its observed
	// delay is trusted: until then it is not hedged.
	minSamples = 100
)

func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < subCount {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v is in [2^e, 2^(e+1))
	if e > maxExp {
		return numBuckets - 1
	}
	sub := int(v>>(e-subBits)) & (subCount - 1)
	return (e-subBits+1)*subCount + sub
}

// upperBound is the longest latency bucket i holds.
func upperBound(i int) time.Duration {
	if i < subCount {
		return time.Duration(i)
	}
	e := i/subCount + subBits - 1
	sub := i % subCount
	width := uint64(1) << (e - subBits)
	lower := (uint64(subCount) + uint64(sub)) << (e - subBits)
	return time.Duration(lower + width - 1)
}

type histogram struct {
	counts [numBuckets]atomic.Uint32
}

// tracker follows one method's attempt latencies and keeps the delay
// after which its calls are hedged: the configured percentile of them.
// Observing is a few atomic adds; the percentile is computed again every
// recomputeEvery observations, by whichever caller gets the lock.
type tracker struct {
	percentile float64 // 0 to 1
	windows    [2]histogram
	current    atomic.Uint32 // index of the window being filled
	n          atomic.Uint32 // latencies in the current window
	delay      atomic.Int64  // ns; 0 until minSamples were seen
	mu         sync.Mutex    // rotation and computation
}

func newTracker(percentile float64) *tracker {
	return &tracker{percentile: percentile}
}

// Delay is the method's observed percentile, or 0 while too few
// latencies were seen.
func (t *tracker) Delay() time.Duration { return time.Duration(t.delay.Load()) }

func (t *tracker) observe(d time.Duration) {
	c := t.current.Load() & 1
	t.windows[c].counts[bucketOf(d)].Add(1)
	n := t.n.Add(1)
	if n%recomputeEvery != 0 || !t.mu.TryLock() {
		return
	}
	defer t.mu.Unlock()
	if n >= window && t.current.Load()&1 == c {
		// The window before this one gives way to a fresh one. A latency
		// observed while it is cleared may be lost: it is one of thousands.
		old := &t.windows[c^1]
		for i := range old.counts {
			old.counts[i].Store(0)
		}
		t.current.Store(c ^ 1)
		t.n.Store(0)
	}
	t.compute()
}

// compute stores the percentile of both windows' latencies.
func (t *tracker) compute() {
	var counts [numBuckets]uint64
	var total uint64
	for w := range t.windows {
		for i := range counts {
			c := uint64(t.windows[w].counts[i].Load())
			counts[i] += c
			total += c
		}
	}
	if total < minSamples {
		t.delay.Store(0)
		return
	}
	rank := uint64(t.percentile * float64(total))
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen > rank || i == numBuckets-1 {
			t.delay.Store(int64(max(upperBound(i), 1)))
			return
		}
	}
}

// maxTrackedMethods bounds the methods tracked one by one; the others
// share one tracker. Method names are the caller's code's, but a bound
// costs nothing.
const maxTrackedMethods = 1024

// trackers keeps one tracker per method.
type trackers struct {
	percentile float64
	byMethod   sync.Map // string → *tracker
	count      atomic.Int32
	others     *tracker
}

func newTrackers(percentile float64) *trackers {
	return &trackers{percentile: percentile, others: newTracker(percentile)}
}

func (ts *trackers) forMethod(method string) *tracker {
	if t, ok := ts.byMethod.Load(method); ok {
		return t.(*tracker)
	}
	if ts.count.Add(1) > maxTrackedMethods {
		return ts.others
	}
	t, _ := ts.byMethod.LoadOrStore(method, newTracker(ts.percentile))
	return t.(*tracker)
}
