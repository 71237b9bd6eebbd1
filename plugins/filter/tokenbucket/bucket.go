package tokenbucket

import (
	"strings"
	"sync"
	"sync/atomic"
)

// bucket is a token bucket kept as GCRA (the generic cell rate
// algorithm): instead of a token count refilled by a clock, one atomic
// "theoretical arrival time" tat. Taking a token moves tat one interval
// on from max(tat, now); the bucket is empty when that would put tat more
// than burst intervals ahead of now. A full bucket (tat at or before now)
// holds burst tokens, and it refills at one token per interval. Taking is
// one compare-and-swap, with no lock and no allocation.
type bucket struct {
	tat      atomic.Int64  // ns on the filter's clock
	interval int64         // ns per token
	capacity int64         // burst * interval
	rejected atomic.Uint64 // calls that got no token, for ReportState
}

func newBucket(interval int64, burst int) *bucket {
	return &bucket{interval: interval, capacity: int64(burst) * interval}
}

// take takes a token at now if one is there, or reserves the next one if
// it comes within maxWait (0: only a token already there). It returns how
// long the caller must wait for its token (0 when one was there) and ok;
// without a token, wait is how long until one comes, and nothing is
// taken.
func (b *bucket) take(now, maxWait int64) (wait int64, ok bool) {
	for {
		old := b.tat.Load()
		next := max(old, now) + b.interval
		wait = next - now - b.capacity
		if wait > maxWait {
			return wait, false
		}
		if b.tat.CompareAndSwap(old, next) {
			return max(wait, 0), true
		}
	}
}

// giveBack returns a token taken but not used (its caller gave up waiting).
func (b *bucket) giveBack() { b.tat.Add(-b.interval) }

// maxBuckets bounds the buckets of scope method: a method past it shares
// one overflow bucket with the others past it.
const maxBuckets = 1024

// buckets holds one bucket per method, in a copy-on-write map: a lookup
// is one atomic load and a map access.
type buckets struct {
	interval int64
	burst    int

	m        atomic.Pointer[map[string]*bucket]
	mu       sync.Mutex // serializes copies
	overflow *bucket
}

func newBuckets(interval int64, burst int) *buckets {
	bs := &buckets{interval: interval, burst: burst, overflow: newBucket(interval, burst)}
	m := map[string]*bucket{}
	bs.m.Store(&m)
	return bs
}

func (bs *buckets) lookup(method string) *bucket {
	if b, ok := (*bs.m.Load())[method]; ok {
		return b
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	old := *bs.m.Load()
	if b, ok := old[method]; ok {
		return b
	}
	if len(old) >= maxBuckets {
		return bs.overflow
	}
	next := make(map[string]*bucket, len(old)+1)
	for k, b := range old {
		next[k] = b
	}
	b := newBucket(bs.interval, bs.burst)
	next[strings.Clone(method)] = b // the method may point into a frame the server reuses
	bs.m.Store(&next)
	return b
}
