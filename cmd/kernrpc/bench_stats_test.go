package main

import (
	"math"
	"testing"
	"time"
)

// Every percentile is within 1% of the exact one, and the maximum exact,
// over durations spread across six orders of magnitude.
func TestLatencyPercentilesWithinOnePercent(t *testing.T) {
	var a, b latencies
	var all []time.Duration
	for i := 1; i <= 100000; i++ {
		d := time.Duration(math.Pow(10, 6*float64(i)/100000)) * 100 // 100ns to 100ms
		all = append(all, d)
		if i%2 == 0 {
			a.add(d)
		} else {
			b.add(d)
		}
	}
	a.merge(&b)
	if a.n != uint64(len(all)) || a.max != all[len(all)-1] {
		t.Fatalf("merged %d calls, max %s; want %d, %s", a.n, a.max, len(all), all[len(all)-1])
	}
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		exact := all[int(math.Ceil(q*float64(len(all))))-1]
		got := a.quantile(q)
		if diff := math.Abs(float64(got-exact)) / float64(exact); diff > 0.01 {
			t.Errorf("p%g: %s, exact %s (%.2f%% off)", q*100, got, exact, diff*100)
		}
	}
	var empty latencies
	if empty.quantile(0.5) != 0 {
		t.Error("an empty histogram has a median")
	}
}

func TestBucketsAreOrderedAndContiguous(t *testing.T) {
	prev := -1
	for d := time.Duration(1); d < time.Hour; d = d*101/100 + 1 {
		b := bucket(d)
		if b < prev {
			t.Fatalf("bucket(%s) = %d, below bucket of a shorter duration (%d)", d, b, prev)
		}
		if mid := bucketMid(b); math.Abs(float64(mid-d))/float64(d) > 0.01 {
			t.Fatalf("bucket(%s) = %d, whose middle %s is more than 1%% off", d, b, mid)
		}
		prev = b
	}
}

// A percentile is the nearest rank, rounded up: with 2 calls of 160 slow,
// 1.25% of them, p99 is slow, since fewer than 99% of the calls were
// fast. Rounding the rank to the nearest took the 158th call and hid the
// tail.
func TestPercentileRoundsTheRankUp(t *testing.T) {
	var l latencies
	for range 158 {
		l.add(time.Millisecond)
	}
	l.add(100 * time.Millisecond)
	l.add(100 * time.Millisecond)
	if got := l.quantile(0.99); got < 99*time.Millisecond {
		t.Errorf("p99 of 158 calls of 1ms and 2 of 100ms: %s, want 100ms", got)
	}
	if got := l.quantile(0.98); got > 2*time.Millisecond {
		t.Errorf("p98 of 158 calls of 1ms and 2 of 100ms: %s, want 1ms", got)
	}
}
