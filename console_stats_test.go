package kernrpc

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func TestLatencyBuckets(t *testing.T) {
	prev := -1
	for d := time.Duration(1); d < 3*time.Hour; d = d*9/8 + 1 {
		i := latencyBucket(d)
		if i < prev {
			t.Fatalf("bucket of %v is %d, below the bucket of a shorter duration (%d)", d, i, prev)
		}
		prev = i
		lo, hi := latencyBounds(i)
		if i < latencyBuckets-1 && (d < lo || d >= hi) {
			t.Fatalf("%v is in bucket %d, whose bounds are [%v, %v)", d, i, lo, hi)
		}
		if i >= 1<<latencySubBits && i < latencyBuckets-1 && float64(hi-lo)/float64(lo) > 0.26 {
			t.Fatalf("bucket %d [%v, %v) is wider than a quarter of its start", i, lo, hi)
		}
	}
	if lo, _ := latencyBounds(latencyBuckets - 1); lo < 2*time.Hour {
		t.Errorf("the last bucket starts at %v; want durations up to 2h told apart", lo)
	}
	if i := latencyBucket(100 * time.Hour); i != latencyBuckets-1 {
		t.Errorf("100 hours are in bucket %d, want the last (%d)", i, latencyBuckets-1)
	}
	if i := latencyBucket(-time.Second); i != 0 {
		t.Errorf("a negative duration is in bucket %d, want 0", i)
	}
}

func TestPercentilesFromKnownLatencies(t *testing.T) {
	const now = 1_000_000
	for _, tc := range []struct {
		name     string
		lat      func(i int) time.Duration
		n        int
		p50, p99 time.Duration
	}{
		{"uniform 1..1000µs", func(i int) time.Duration { return time.Duration(i+1) * time.Microsecond }, 1000, 500 * time.Microsecond, 990 * time.Microsecond},
		{"all 3ms", func(int) time.Duration { return 3 * time.Millisecond }, 50, 3 * time.Millisecond, 3 * time.Millisecond},
		{"98 quick, 2 slow", func(i int) time.Duration {
			if i < 98 {
				return 100 * time.Microsecond
			}
			return 2 * time.Second
		}, 100, 100 * time.Microsecond, 2 * time.Second},
		// Long polls: a method whose calls wait minutes for news.
		{"long polls of 1 to 10 min", func(i int) time.Duration { return time.Duration(i%10+1) * time.Minute }, 100, 5 * time.Minute, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &methodStats{name: "Svc.M"}
			for i := range tc.n {
				m.record(kernel.OK, tc.lat(i), now)
			}
			v := m.view(now, rateWindow)
			for _, c := range []struct {
				what      string
				got, want time.Duration
			}{{"p50", time.Duration(v.P50Millis * float64(time.Millisecond)), tc.p50}, {"p99", time.Duration(v.P99Millis * float64(time.Millisecond)), tc.p99}} {
				if rel := math.Abs(float64(c.got-c.want)) / float64(c.want); rel > 0.13 {
					t.Errorf("%s = %v, want %v within 13%% (off by %.0f%%)", c.what, c.got, c.want, 100*rel)
				}
			}
		})
	}
	if p := percentile(&[latencyBuckets]uint64{}, 0.5); p != 0 {
		t.Errorf("p50 of no calls = %v, want 0", p)
	}
}

func TestRateWindow(t *testing.T) {
	const now = 1_000_000
	m := &methodStats{name: "Svc.M"}
	// 12 seconds back: outside the 10s window. Then 5 calls a second for
	// the 10 whole seconds before now, one of them failing, and calls in
	// the current second, which is not whole yet.
	for range 7 {
		m.record(kernel.OK, time.Millisecond, now-12)
	}
	for s := int64(now - 10); s < now; s++ {
		for i := range 5 {
			code := kernel.OK
			if i == 0 {
				code = kernel.Unavailable
			}
			m.record(code, time.Millisecond, s)
		}
	}
	for range 100 {
		m.record(kernel.OK, time.Millisecond, now)
	}
	v := m.view(now, rateWindow)
	if v.WindowCalls != 50 || v.QPS != 5 {
		t.Errorf("window calls %d, QPS %v; want 50 and 5", v.WindowCalls, v.QPS)
	}
	if v.ErrorRate != 0.2 {
		t.Errorf("error rate %v, want 0.2", v.ErrorRate)
	}
	if v.Calls != 157 || v.Errors != 10 || v.Codes["OK"] != 147 || v.Codes["Unavailable"] != 10 {
		t.Errorf("totals: calls %d errors %d codes %v; want 157, 10, OK 147 and Unavailable 10", v.Calls, v.Errors, v.Codes)
	}
	if v.Service != "Svc" || v.Method != "Svc.M" {
		t.Errorf("service %q method %q", v.Service, v.Method)
	}
	// A minute on, with no calls since: the ring's slots are stale, not
	// read as current.
	if v := m.view(now+60, rateWindow); v.WindowCalls != 0 || v.QPS != 0 || v.P50Millis != 0 {
		t.Errorf("a minute later: window calls %d, QPS %v, p50 %vms; want 0", v.WindowCalls, v.QPS, v.P50Millis)
	}
	// Exactly one ring turn later, each slot holds the old epoch's count.
	if v := m.view(now+secondSlots, rateWindow); v.WindowCalls != 0 {
		t.Errorf("one ring turn later: window calls %d, want 0", v.WindowCalls)
	}
	// Just after the start the window is shorter.
	if v := m.view(now, 2); v.QPS != 5 {
		t.Errorf("QPS over a 2s window: %v, want 5", v.QPS)
	}
}

func TestWindowCounterEpochs(t *testing.T) {
	var c windowCounter
	c.add(5)
	c.add(5)
	if n := c.in(5); n != 2 {
		t.Errorf("in(5) = %d, want 2", n)
	}
	c.add(6)
	if n5, n6 := c.in(5), c.in(6); n5 != 0 || n6 != 1 {
		t.Errorf("after a new epoch: in(5) = %d, in(6) = %d; want 0 and 1", n5, n6)
	}
	// Epochs a whole epoch space apart share the bits: harmless, since
	// that is 194 days.
	if n := c.in(6 + 1<<epochBits); n != 1 {
		t.Errorf("in(6+2^%d) = %d", epochBits, n)
	}
}

func TestStatsConcurrentRecord(t *testing.T) {
	const goroutines, each = 8, 2000
	now := time.Now().Unix()
	m := &methodStats{name: "Svc.M"}
	var sl slowest
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				code := kernel.OK
				if i%4 == 0 {
					code = kernel.Internal
				}
				d := time.Duration(g*each+i) * time.Microsecond
				m.record(code, d, now)
				if sl.worth(d, now) {
					sl.add(slowCall{At: time.Unix(now, 0), Duration: d, Method: "Svc.M"}, now)
				}
			}
		})
	}
	wg.Wait()
	v := m.view(now+1, 1)
	if v.Calls != goroutines*each || v.WindowCalls != goroutines*each || v.Errors != goroutines*each/4 {
		t.Errorf("calls %d, window calls %d, errors %d; want %d, %d, %d", v.Calls, v.WindowCalls, v.Errors, goroutines*each, goroutines*each, goroutines*each/4)
	}
	got := sl.list(time.Unix(now, 0))
	if len(got) != slowestKept {
		t.Fatalf("kept %d slow calls, want %d", len(got), slowestKept)
	}
	for i, c := range got {
		if want := time.Duration(goroutines*each-1-i) * time.Microsecond; c.Duration != want {
			t.Errorf("slowest[%d] = %v, want %v", i, c.Duration, want)
		}
	}
}

func TestSlowestAgesOut(t *testing.T) {
	var sl slowest
	base := time.Unix(1_000_000, 0)
	for i := range 30 {
		at := base.Add(time.Duration(i) * 3 * time.Second) // over 90s
		if d := time.Duration(i+1) * time.Millisecond; sl.worth(d, at.Unix()) {
			sl.add(slowCall{At: at, Duration: d}, at.Unix())
		}
	}
	now := base.Add(90 * time.Second)
	got := sl.list(now)
	for _, c := range got {
		if now.Sub(c.At) >= slowAge {
			t.Errorf("a call of %v ago is still listed", now.Sub(c.At))
		}
	}
	if len(got) != 19 || got[0].Duration != 30*time.Millisecond || got[18].Duration != 12*time.Millisecond {
		t.Errorf("kept %d calls, %v", len(got), got)
	}
}

func TestTraceID(t *testing.T) {
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": "",
		"00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01":   "",
		"garbage": "",
		"":        "",
	} {
		if got := traceID(kernel.Metadata{"traceparent": tp}); got != want {
			t.Errorf("traceID(%q) = %q, want %q", tp, got, want)
		}
	}
	if got := traceID(nil); got != "" {
		t.Errorf("traceID(nil) = %q", got)
	}
}

// addrConn is a connection that only knows its peer's address.
type addrConn struct{ kernel.Conn }

func (addrConn) RemoteAddr() string { return "10.0.0.1:5000" }

func TestRecordDoesNotAllocate(t *testing.T) {
	desc := &methodDesc{}
	var st serverStats
	st.init(map[string]*methodDesc{"Svc.M": desc}, time.Now())
	sc := &serverConn{conn: addrConn{}}
	c := &callCtx{desc: desc}
	c.info.Method = "Svc.M"
	c.info.Metadata = kernel.Metadata{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	// Slow calls first (each may enter the list), then quick ones.
	for _, lat := range []time.Duration{time.Hour, 0} {
		allocs := testing.AllocsPerRun(500, func() {
			st.record(sc, c, st.mono()-int64(lat))
		})
		if allocs != 0 {
			t.Errorf("record of a call %v long: %v allocations, want 0", lat, allocs)
		}
	}
	ms := st.methods(time.Now())
	if len(ms) != 1 || ms[0].Calls != 1002 {
		t.Errorf("methods: %+v; want Svc.M with 1002 calls", ms)
	}
	if sl := st.slow.list(time.Now()); len(sl) != slowestKept || sl[0].TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || sl[0].Peer != "10.0.0.1:5000" {
		t.Errorf("slowest: %d calls, first %+v", len(sl), sl[0])
	}
	// A call of a method the server does not serve counts apart.
	st.record(sc, &callCtx{}, st.mono())
	if ms := st.methods(time.Now()); len(ms) != 2 || ms[1].Method != otherMethods || ms[1].Calls != 1 {
		t.Errorf("after an unknown method's call: %v", ms)
	}
}

func BenchmarkStatsRecord(b *testing.B) {
	desc := &methodDesc{}
	var st serverStats
	st.init(map[string]*methodDesc{"Svc.M": desc}, time.Now())
	sc := &serverConn{conn: addrConn{}}
	b.Run("serial", func(b *testing.B) {
		c := &callCtx{desc: desc}
		b.ReportAllocs()
		for b.Loop() {
			st.record(sc, c, st.mono())
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			c := &callCtx{desc: desc}
			for pb.Next() {
				st.record(sc, c, st.mono())
			}
		})
	})
}

// Just after the start, the rate window's first second is the one the
// stats began in, of which they counted only a part: the QPS is over the
// time counted, not over whole seconds nobody counted.
func TestRateJustAfterStart(t *testing.T) {
	desc := &methodDesc{}
	var st serverStats
	const start = 1_000_000
	st.init(map[string]*methodDesc{"Svc.M": desc}, time.Unix(start, 900*int64(time.Millisecond)))
	m := st.byDesc[desc]
	// 100 calls a second from the start: 10 in its last tenth of the
	// start's second, then 100 in each of the next.
	for range 10 {
		m.record(kernel.OK, time.Millisecond, start)
	}
	for s := int64(start + 1); s < start+12; s++ {
		for range 100 {
			m.record(kernel.OK, time.Millisecond, s)
		}
	}
	for _, at := range []int64{start + 1, start + 2, start + 5, start + 10, start + 11, start + 12} {
		v := st.methods(time.Unix(at, 500*int64(time.Millisecond)))[0]
		if math.Abs(v.QPS-100) > 1e-6 {
			t.Errorf("%ds after the start's second: QPS %v over %d calls; want 100", at-start, v.QPS, v.WindowCalls)
		}
	}
	if v := st.methods(time.Unix(start, 950*int64(time.Millisecond)))[0]; v.QPS != 0 || v.WindowCalls != 0 {
		t.Errorf("in the start's own second: QPS %v, window calls %d; want 0 (no second over yet)", v.QPS, v.WindowCalls)
	}
}

// A client names the methods it calls, served or not, and a name may be
// as long as a frame allows: the slowest calls keep a bounded part of it,
// not megabytes a call for a minute, served to every open page each
// second.
func TestSlowestKeepsBoundedMethodNames(t *testing.T) {
	desc := &methodDesc{}
	var st serverStats
	st.init(map[string]*methodDesc{"Svc.M": desc}, time.Now())
	sc := &serverConn{conn: addrConn{}}
	long := strings.Repeat("x", 1<<20)
	for range slowestKept {
		c := &callCtx{}
		c.info.Method = long
		st.record(sc, c, st.mono()-int64(time.Millisecond))
	}
	served := &callCtx{desc: desc}
	served.info.Method = "Svc.M"
	st.record(sc, served, st.mono()-int64(time.Second))
	got := st.slow.list(st.clock())
	if len(got) != slowestKept {
		t.Fatalf("%d slow calls kept, want %d", len(got), slowestKept)
	}
	if got[0].Method != "Svc.M" {
		t.Errorf("slowest call of %q, want Svc.M", got[0].Method)
	}
	total := 0
	for _, c := range got[1:] {
		total += len(c.Method)
		if !strings.HasPrefix(c.Method, "xxxx") {
			t.Errorf("a call of the unknown method is listed as %.40q", c.Method)
		}
	}
	if total > slowestKept*maxSlowMethodName {
		t.Errorf("the slowest calls keep %d bytes of method names from %d calls; want at most %d each", total, len(got)-1, maxSlowMethodName)
	}
}
