package overload

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

const ms = int64(time.Millisecond)

// feed gives g windows full windows of calls that each took rtt with
// inflight in flight, one every ms on the clock *now.
func feed(g *gradient, now *int64, windows int, rtt int64, inflight int) {
	for done := 0; done < windows; {
		*now += ms
		if g.sample(*now, rtt, inflight) {
			done++
		}
	}
}

// While latency stays at its long-term level and the server uses its
// limit, the limit grows by about queueSize·smoothing a window.
func TestGradientGrowsWhileLatencyHolds(t *testing.T) {
	g := newGradient(20, 20, 1000)
	var now int64
	feed(&g, &now, 50, 10*ms, 1000)
	t.Logf("after 50 windows at a steady 10ms, using the limit: limit %.1f (from 20), long-term latency %v", g.limit, time.Duration(g.long))
	if g.limit < 20+50*queueSize*smoothing*0.99 {
		t.Errorf("limit %.1f, want about %v", g.limit, 20+50*queueSize*smoothing)
	}
	if time.Duration(g.long) != 10*time.Millisecond {
		t.Errorf("long-term latency %v, want 10ms", time.Duration(g.long))
	}
}

// A server that uses under half its limit does not make it grow.
func TestGradientAppLimitedHolds(t *testing.T) {
	g := newGradient(40, 20, 1000)
	var now int64
	feed(&g, &now, 50, 10*ms, 5)
	if g.limit != 40 {
		t.Errorf("limit %.1f after windows with 5 of 40 in flight, want it left at 40", g.limit)
	}
}

// When short-term latency rises past tolerance × long-term, the limit
// shrinks, toward min_limit, and never below it; it stops at max_limit.
func TestGradientShrinksWhenLatencyRisesAndKeepsBounds(t *testing.T) {
	g := newGradient(100, 20, 1000)
	var now int64
	feed(&g, &now, 20, 10*ms, 1000)
	before := g.limit
	feed(&g, &now, 1, 30*ms, 1000)
	// gradient = 1.5·long/short = 0.5: 0.8·l + 0.2·(0.5·l + 4).
	want := before*0.8 + 0.2*(before*0.5+queueSize)
	if d := g.limit - want; d > 0.5 || d < -0.5 {
		t.Errorf("one window at 3× the long-term latency: limit %.1f → %.1f, want %.1f", before, g.limit, want)
	}
	// A window's latency at 1.2× long is within tolerance: no cut.
	mid := g.limit
	feed(&g, &now, 1, 12*ms, 1000)
	if g.limit < mid {
		t.Errorf("latency at 1.2× long-term cut the limit %.1f → %.1f", mid, g.limit)
	}
	feed(&g, &now, 40, 40*ms, 1000)
	t.Logf("limit %.1f → %.1f in one slow window, %.1f after 40 more (min 20), long-term %v", before, want, g.limit, time.Duration(g.long))
	if g.limit != 20 {
		t.Errorf("after 40 windows at 4×: limit %.1f, want min_limit 20", g.limit)
	}
	g2 := newGradient(990, 20, 1000)
	feed(&g2, &now, 20, 10*ms, 2000)
	if g2.limit != 1000 {
		t.Errorf("limit %.1f, want max_limit 1000", g2.limit)
	}
}

// A quiet server closes a window after maxWindowNs with fewer calls.
func TestGradientWindowClosesOnTime(t *testing.T) {
	g := newGradient(20, 20, 1000)
	if g.sample(0, ms, 20) || g.sample(int64(maxWindowNs)-1, ms, 20) {
		t.Fatal("a window of 2 calls closed before 1s")
	}
	if !g.sample(int64(maxWindowNs), ms, 20) {
		t.Fatal("a window 1s old did not close")
	}
}

// CoDel sheds nothing until the delay has stayed above target for a whole
// interval; then at interval/√n; stops with the first call below target;
// and a quick re-entry starts from the drop rate last needed.
func TestCodelDropsAfterAnIntervalShortensAndStops(t *testing.T) {
	c := codel{target: 5 * ms, interval: 100 * ms}
	// Above target for 99ms: no drop.
	for now := int64(0); now < 100*ms; now += ms {
		if c.dequeue(now, 6*ms) {
			t.Fatalf("dropped at %v, before the delay stayed above target for an interval", time.Duration(now))
		}
	}
	// A dip below target restarts the interval.
	c.dequeue(100*ms, 4*ms)
	var drops []int64
	for now := 101 * ms; now < 600*ms; now += ms {
		if c.dequeue(now, 6*ms) {
			drops = append(drops, now)
		}
	}
	if len(drops) < 4 || drops[0] != 201*ms {
		t.Fatalf("drops at %v; want the first at 201ms (100ms after the delay came back above)", drops)
	}
	for i := 1; i < len(drops); i++ {
		// The n-th drop schedules the next at interval/√n.
		gap, want := drops[i]-drops[i-1], int64(float64(100*ms)/sqrtInt(i))
		if gap < want-ms || gap > want+ms {
			t.Errorf("gap after drop %d: %v, want interval/√%d = %v", i, time.Duration(gap), i, time.Duration(want))
		}
		if i > 1 && gap > drops[i-1]-drops[i-2] {
			t.Errorf("gap before drop %d grew", i+1)
		}
	}
	t.Logf("drops at %v ms", msList(drops))
	if c.dequeue(600*ms, 1*ms) || c.dropping {
		t.Fatal("a call below target did not end the dropping state")
	}
	n := c.count
	// Right back above target: a new interval first, then count resumes
	// from the drops of the last episode.
	for now := 601 * ms; now < 701*ms; now += ms {
		if c.dequeue(now, 6*ms) && now < 701*ms {
			t.Fatalf("dropped at %v, less than an interval after the delay rose again", time.Duration(now))
		}
	}
	if !c.dequeue(701*ms, 6*ms) || c.count != n-1 {
		t.Errorf("re-entry: count %d, want %d (the last episode's drops, less the one it began with)", c.count, n-1)
	}
	c.empty()
	if c.dropping || c.firstAbove != 0 {
		t.Error("an empty queue did not end the dropping state")
	}
}

func sqrtInt(n int) float64 {
	x := float64(n)
	r := x
	for range 50 {
		r = (r + x/r) / 2
	}
	return r
}

func msList(ts []int64) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t / ms
	}
	return out
}

// The filter in mode codel on a clock the test moves: calls above the
// limit wait, leave the queue in order as slots free, and once the delay
// has stayed above target for an interval are shed, and arrivals that would
// wait are rejected at once.
func TestCodelFilterQueuesThenSheds(t *testing.T) {
	flt, err := Factory.Build(map[string]any{"mode": "codel", "initial_limit": 2, "min_limit": 2, "max_limit": 2}, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := flt.(*Filter)
	var clock atomic.Int64
	f.now = clock.Load
	info := func() *kernel.CallInfo { return &kernel.CallInfo{Method: "M", Side: kernel.ServerSide} }
	ctx := context.Background()
	// Two in flight fill the limit.
	release := make([]chan struct{}, 0)
	hold := func() {
		ch := make(chan struct{})
		release = append(release, ch)
		started := make(chan struct{})
		go f.Invoke(ctx, info(), nil, func(context.Context, *kernel.CallInfo, any) (any, error) { close(started); <-ch; return "ok", nil })
		<-started
	}
	for range 2 {
		if err := f.Admit(ctx, info()); err != nil {
			t.Fatal(err)
		}
		hold()
	}
	// A third waits.
	admitted := make(chan error, 1)
	go func() { admitted <- f.Admit(ctx, info()) }()
	waitQueued(t, f, 1)
	clock.Add(6 * ms)
	close(release[0]) // a slot frees after 6ms: above target, but not for an interval
	if err := <-admitted; err != nil {
		t.Fatalf("a call that waited 6ms, the first above target: %v", err)
	}
	hold()
	// Another waits 101ms with the delay above target all along: shed.
	go func() { admitted <- f.Admit(ctx, info()) }()
	waitQueued(t, f, 1)
	clock.Add(101 * ms)
	close(release[1])
	err = <-admitted
	if kernel.CodeOf(err) != kernel.ResourceExhausted || !kernel.IsRetryable(err) {
		t.Fatalf("a call that waited 101ms above target: %v, want shed (ResourceExhausted, retryable)", err)
	}
	t.Logf("shed: %v", err)
	// The shed call's slot is free: a new call takes it at once.
	if err := f.Admit(ctx, info()); err != nil {
		t.Fatalf("a free slot, nobody waiting: %v", err)
	}
	hold()
	// Full, and CoDel is shedding: a call that would wait is rejected at
	// once.
	if err := f.Admit(ctx, info()); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("shedding, no slot: %v, want ResourceExhausted at once", err)
	}
	// A slot frees with nobody waiting: the delay is gone, shedding stops.
	close(release[2])
	waitInflight(t, f, 1)
	f.mu.Lock()
	dropping := f.cd.dropping
	f.mu.Unlock()
	if dropping {
		t.Fatal("still shedding after the queue emptied")
	}
	if err := f.Admit(ctx, info()); err != nil {
		t.Fatal(err)
	}
	hold()
	// Full again: calls queue, up to limit of them; then rejection at once.
	go func() { admitted <- f.Admit(ctx, info()) }()
	waitQueued(t, f, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() { admitted <- f.Admit(cctx, info()) }()
	waitQueued(t, f, 2)
	if err := f.Admit(ctx, info()); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a full queue (2 of 2): %v, want ResourceExhausted at once", err)
	}
	cancel()
	if err := <-admitted; kernel.CodeOf(err) != kernel.Canceled {
		t.Fatalf("a waiter whose context ended: %v, want Canceled", err)
	}
	waitQueued(t, f, 1)
	close(release[3])
	if err := <-admitted; err != nil {
		t.Fatalf("the waiter left: %v", err)
	}
	hold()
	close(release[4])
	close(release[5])
	waitInflight(t, f, 0)
}

func waitInflight(t *testing.T, f *Filter, n int64) {
	t.Helper()
	for range 2000 {
		if f.inflight.Load() == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("in flight never fell to %d", n)
}

func waitQueued(t *testing.T, f *Filter, n int) {
	t.Helper()
	for range 2000 {
		f.mu.Lock()
		q := len(f.queue)
		f.mu.Unlock()
		if q == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("queue never held %d calls", n)
}
