package hedge

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBucketsCoverEveryLatencyInOrder(t *testing.T) {
	prev := -1
	for _, d := range []time.Duration{0, 1, 7, 8, 9, 15, 16, 17, 100, 1000, time.Microsecond, time.Millisecond, time.Second, time.Hour, 1 << 62} {
		i := bucketOf(d)
		if i < prev || i >= numBuckets {
			t.Fatalf("bucketOf(%v) = %d after %d (of %d)", d, i, prev, numBuckets)
		}
		prev = i
		if d < 1<<41 && (upperBound(i) < d || (i > 0 && upperBound(i-1) >= d)) {
			t.Errorf("%v in bucket %d, which holds (%v, %v]", d, i, upperBound(i-1), upperBound(i))
		}
		if d >= 8 && d < 1<<41 && float64(upperBound(i)-d) > 0.125*float64(d) {
			t.Errorf("%v reported as %v: more than 12.5%% off", d, upperBound(i))
		}
	}
}

func TestTrackerFindsThePercentile(t *testing.T) {
	tr := newTracker(0.95)
	for i := range minSamples - 1 {
		tr.observe(time.Duration(i) * time.Microsecond)
	}
	if tr.Delay() != 0 {
		t.Fatalf("delay %v before %d latencies were seen, want 0", tr.Delay(), minSamples)
	}
	// 1000 latencies spread evenly over 1..1000µs: the 95th is 950µs.
	tr = newTracker(0.95)
	for _, i := range rand.Perm(1000) {
		tr.observe(time.Duration(i+1) * time.Microsecond)
	}
	if d := tr.Delay(); d < 950*time.Microsecond || d > 1070*time.Microsecond {
		t.Errorf("p95 of 1..1000µs = %v, want 950µs within a bucket", d)
	}
	// Latencies moving to 10ms take over within two windows.
	for range 2 * window {
		tr.observe(10 * time.Millisecond)
	}
	if d := tr.Delay(); d < 10*time.Millisecond || d > 11300*time.Microsecond {
		t.Errorf("p95 after 2 windows at 10ms = %v, want 10ms within a bucket", d)
	}
}

func BenchmarkObserve(b *testing.B) {
	tr := newTracker(0.95)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := time.Duration(0)
		for pb.Next() {
			d += 1000
			tr.observe(d % time.Millisecond)
		}
	})
}
