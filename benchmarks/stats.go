package main

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// histogram records call latencies in fixed log-linear buckets: values below
// 128 ns are exact, and every power of two above is split into 64 buckets, so
// a percentile read from it is within 1/64 (1.6%) of the true value. It is a
// plain array, allocated once per caller before a round starts, so recording
// a call costs a few instructions and never allocates: the harness's own
// per-call work must not show up in the client's allocations per call.
//
// A histogram belongs to one goroutine while it records; merge them after.
type histogram struct {
	counts  [histBuckets]uint64
	n       uint64 // events: calls, or messages of a stream
	samples uint64 // latencies in counts: n, or fewer where only some are timed
	sum     uint64 // nanoseconds, exact, for the mean
	max     uint64
}

const (
	histSubBits = 6                    // 64 buckets per power of two
	histExact   = 2 << histSubBits     // values below this have a bucket each
	histMaxExp  = 40 - histSubBits - 1 // covers up to 2^40 ns (18 minutes)
	histBuckets = (histMaxExp + 2) << histSubBits
	histMaxNs   = uint64(1)<<40 - 1
)

// bucketOf maps a value in nanoseconds to its bucket. For v >= 128 the
// bucket is shift*64 + (v >> shift) where shift keeps the top 7 bits of v,
// so buckets stay contiguous with the exact ones below.
func bucketOf(v uint64) int {
	if v < histExact {
		return int(v)
	}
	if v > histMaxNs {
		v = histMaxNs
	}
	shift := bits.Len64(v) - (histSubBits + 1)
	return shift<<histSubBits + int(v>>shift)
}

// bucketMid is the value a bucket stands for when percentiles are read: the
// middle of the range of values that land in it.
func bucketMid(b int) uint64 {
	if b < histExact {
		return uint64(b)
	}
	shift := b>>histSubBits - 1
	lo := uint64(b-shift<<histSubBits) << shift
	return lo + (uint64(1)<<shift)/2
}

// record adds one latency.
func (h *histogram) record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[bucketOf(v)]++
	h.n++
	h.samples++
	h.sum += v
	if v > h.max {
		h.max = v
	}
}

// tally counts an event whose latency was not timed.
func (h *histogram) tally() { h.n++ }

// merge adds o's samples to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.samples += o.samples
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// mean is exact (from the sum), not read from buckets.
func (h *histogram) mean() time.Duration {
	if h.samples == 0 {
		return 0
	}
	return time.Duration(h.sum / h.samples)
}

// quantile returns the latency below which a fraction q of the calls fell,
// to the histogram's resolution; never more than the largest seen.
func (h *histogram) quantile(q float64) time.Duration {
	if h.samples == 0 {
		return 0
	}
	// The nearest rank rounded up: rounded to the nearest, p99 of 160
	// calls would be the 158th, hiding the 2 slowest. The epsilon keeps a
	// product such as 0.07*100 = 7.000000000000001 at its integer.
	rank := uint64(math.Ceil(q*float64(h.samples) - 1e-9))
	rank = min(max(rank, 1), h.samples)
	if rank == h.samples {
		return time.Duration(h.max)
	}
	var seen uint64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(bucketMid(b), h.max))
		}
	}
	return time.Duration(h.max)
}

// encode writes h on one line, for a client child to send it to the
// harness: "<n> <sum> <max> <bucket>:<count>,..." with the non-empty
// buckets only.
func (h *histogram) encode() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %d %d ", h.n, h.sum, h.max)
	sep := ""
	for i, c := range h.counts {
		if c != 0 {
			fmt.Fprintf(&b, "%s%d:%d", sep, i, c)
			sep = ","
		}
	}
	if sep == "" {
		b.WriteString("-")
	}
	return b.String()
}

// decode reads what encode wrote into the empty histogram h.
func (h *histogram) decode(s string) error {
	f := strings.Fields(s)
	if len(f) != 4 {
		return fmt.Errorf("histogram %q: want \"<n> <sum> <max> <buckets>\"", s)
	}
	var err error
	vals := []*uint64{&h.n, &h.sum, &h.max}
	for i, p := range vals {
		if *p, err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return fmt.Errorf("histogram %q: %w", s, err)
		}
	}
	var total uint64
	if f[3] != "-" {
		for pair := range strings.SplitSeq(f[3], ",") {
			bs, cs, _ := strings.Cut(pair, ":")
			b, err1 := strconv.Atoi(bs)
			c, err2 := strconv.ParseUint(cs, 10, 64)
			if err1 != nil || err2 != nil || b < 0 || b >= histBuckets {
				return fmt.Errorf("histogram %q: bad bucket %q", s, pair)
			}
			h.counts[b] += c
			total += c
		}
	}
	if total > h.n {
		return fmt.Errorf("histogram %q: buckets hold %d values, more than its %d events", s, total, h.n)
	}
	h.samples = total
	return nil
}
