package main

import (
	"math"
	"math/bits"
	"time"
)

// latencies is a histogram of call durations with buckets about 1% wide
// (subBuckets per power of two), so that a run of millions of calls keeps
// a few tens of kilobytes per caller and any percentile within 1%.
type latencies struct {
	counts [64 * subBuckets]uint64
	n      uint64
	max    time.Duration
}

const subBits = 7
const subBuckets = 1 << subBits

// bucket is the index of d: its power of two, then the next subBits bits.
func bucket(d time.Duration) int {
	v := uint64(max(d, 1))
	exp := bits.Len64(v) - 1 // v is in [2^exp, 2^(exp+1))
	if exp < subBits {
		return int(v) // exact below 2^subBits ns
	}
	sub := (v >> (exp - subBits)) & (subBuckets - 1)
	return (exp-subBits+1)*subBuckets + int(sub)
}

// bucketMid is the middle of bucket i's range.
func bucketMid(i int) time.Duration {
	if i < subBuckets {
		return time.Duration(i)
	}
	exp := i/subBuckets + subBits - 1
	sub := uint64(i % subBuckets)
	lo := (uint64(1) << exp) | sub<<(exp-subBits)
	width := uint64(1) << (exp - subBits)
	return time.Duration(lo + width/2)
}

func (l *latencies) add(d time.Duration) {
	l.counts[bucket(d)]++
	l.n++
	l.max = max(l.max, d)
}

func (l *latencies) merge(o *latencies) {
	for i, c := range o.counts {
		l.counts[i] += c
	}
	l.n += o.n
	l.max = max(l.max, o.max)
}

// quantile is the duration below which a fraction q of the calls took;
// never more than the longest.
func (l *latencies) quantile(q float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	// The nearest rank, rounded up: rounding to the nearest could pick a
	// call with more than 1-q of the calls above it (p99 of 160 calls
	// would be the 158th, hiding the 2 slowest). The epsilon keeps a
	// product such as 0.07*100 = 7.000000000000001 at its integer.
	rank := uint64(math.Ceil(q*float64(l.n) - 1e-9))
	rank = min(max(rank, 1), l.n)
	var seen uint64
	for i, c := range l.counts {
		seen += c
		if seen >= rank {
			return min(bucketMid(i), l.max)
		}
	}
	return l.max
}
