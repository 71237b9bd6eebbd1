package leastload_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/leastload"
)

var info = &kernel.CallInfo{Method: "Echo.Say"}

func set(ids ...string) []kernel.Instance {
	out := make([]kernel.Instance, len(ids))
	for i, id := range ids {
		out[i] = kernel.Instance{Service: "echo", ID: id, Address: id + ".invalid:7000"}
	}
	return out
}

func build(t testing.TB) *leastload.Balancer {
	t.Helper()
	b, err := leastload.New(*leastload.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pick(t testing.TB, b *leastload.Balancer, s []kernel.Instance) *kernel.Instance {
	t.Helper()
	p, err := b.Pick(context.Background(), info)
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	for i := range s {
		if p.ID == s[i].ID && p.Address == s[i].Address && p.Service == s[i].Service {
			return p
		}
	}
	t.Fatalf("Pick = %+v, no instance of the current set", *p)
	return nil
}

// measure makes one call to id taking d, by picking until id comes up
// (ending the other picks as cancelled, which measures nothing).
func measure(t *testing.T, b *leastload.Balancer, s []kernel.Instance, id string, d time.Duration) {
	t.Helper()
	for range 1000 {
		p := pick(t, b, s)
		if p.ID != id {
			b.Done(p, context.Canceled)
			continue
		}
		time.Sleep(d)
		b.Done(p, nil)
		return
	}
	t.Fatalf("1000 picks never chose %s", id)
}

// share makes n calls ended at once and returns the share that went to id.
func share(t *testing.T, b *leastload.Balancer, s []kernel.Instance, id string, n int, err error) float64 {
	t.Helper()
	got := 0
	for range n {
		p := pick(t, b, s)
		if p.ID == id {
			got++
		}
		b.Done(p, err)
	}
	return float64(got) / float64(n)
}

func TestInFlightCallsSpreadEvenlyWithoutLatencies(t *testing.T) {
	b := build(t)
	s := set("a", "b")
	b.Update(s)
	var held []*kernel.Instance
	count := map[string]int{}
	for range 10 {
		p := pick(t, b, s)
		held = append(held, p)
		count[p.ID]++
	}
	if count["a"] != 5 || count["b"] != 5 {
		t.Errorf("10 calls held over two instances never measured = %v; want 5 each (the one with fewer in flight wins)", count)
	}
	for _, p := range held {
		b.Done(p, context.Canceled)
	}
	for _, id := range []string{"a", "b"} {
		if n, _ := leastload.InFlight(b, id); n != 0 {
			t.Errorf("instance %s: %d calls in flight after every Done; want 0", id, n)
		}
	}
}

func TestSlowerInstanceGetsFewerCalls(t *testing.T) {
	b := build(t)
	s := set("slow", "fast")
	b.Update(s)
	measure(t, b, s, "slow", 30*time.Millisecond)
	measure(t, b, s, "fast", 0)
	if got := share(t, b, s, "slow", 200, context.Canceled); got > 0 {
		t.Errorf("the instance measured at 30ms got %.2f of the picks beside one measured at once; want none", got)
	}
}

func TestCancelledAndRefusedCallsMeasureNothing(t *testing.T) {
	for _, err := range []error{
		context.Canceled,
		fmt.Errorf("breaker: open: %w", kernel.ErrInstanceRefused),
		kernel.Errorf(kernel.Canceled, "the caller gave up"),
	} {
		t.Run(err.Error(), func(t *testing.T) {
			b := build(t)
			s := set("a", "b")
			b.Update(s)
			measure(t, b, s, "b", 20*time.Millisecond) // b is slow
			// a's call ends fast but with err: a must still count as unmeasured,
			// taking b's latency, so that the two compare by calls in flight.
			for {
				p := pick(t, b, s)
				b.Done(p, err)
				if p.ID == "a" {
					break
				}
			}
			if got := share(t, b, s, "a", 400, context.Canceled); got < 0.3 || got > 0.7 {
				t.Errorf("after a call ended with %v, a got %.2f of the picks; want about half, as if never measured", err, got)
			}
		})
	}
	t.Run("a failed call measures", func(t *testing.T) {
		b := build(t)
		s := set("a", "b")
		b.Update(s)
		measure(t, b, s, "b", 20*time.Millisecond)
		for {
			p := pick(t, b, s)
			if p.ID != "a" {
				b.Done(p, context.Canceled)
				continue
			}
			b.Done(p, errors.New("connection reset"))
			break
		}
		if got := share(t, b, s, "a", 200, context.Canceled); got < 0.9 {
			t.Errorf("a, measured fast by a failed call, got %.2f of the picks beside slow b; want nearly all", got)
		}
	})
}

func TestReportedLoadForInstancesNeverCalled(t *testing.T) {
	b := build(t)
	s := set("busy", "idle")
	s[0].Load = kernel.Load{InFlight: 50, QPS: 100} // 500ms a call
	s[1].Load = kernel.Load{InFlight: 1, QPS: 1000} // 1ms a call
	b.Update(s)
	if got := share(t, b, s, "busy", 200, context.Canceled); got > 0 {
		t.Errorf("the instance reporting 50 calls in flight at 100/s got %.2f of the picks; want none", got)
	}
	// Once measured, the client's own figure counts, not the report. (Without
	// its report, busy takes idle's reported latency and is picked at times.)
	quiet := set("busy", "idle")
	quiet[1].Load = s[1].Load
	b.Update(quiet)
	measure(t, b, quiet, "idle", 30*time.Millisecond)
	measure(t, b, quiet, "busy", 0)
	b.Update(s)
	if got := share(t, b, s, "busy", 200, context.Canceled); got < 0.99 {
		t.Errorf("busy, measured faster than idle by this client, got %.2f of the picks; want all", got)
	}
}

func TestStateSurvivesUpdateByIDAndIsDroppedForRemovedInstances(t *testing.T) {
	b := build(t)
	s := set("slow", "fast")
	b.Update(s)
	measure(t, b, s, "slow", 30*time.Millisecond)
	measure(t, b, s, "fast", 0)

	again := set("fast", "slow", "new") // a fresh slice, another order
	again[1].Metadata = map[string]string{"zone": "b"}
	b.Update(again)
	measure(t, b, again, "new", 0)
	if got := share(t, b, again, "slow", 300, context.Canceled); got > 0 {
		t.Errorf("after an Update keeping it, slow got %.2f of the picks; want none (its latency is kept by ID)", got)
	}

	b.Update(set("fast", "new"))
	if n, _ := leastload.InFlight(b, "slow"); n != -1 {
		t.Errorf("the balancer keeps state of an instance that left the set")
	}
	back := set("fast", "slow")
	b.Update(back)
	if got := share(t, b, back, "slow", 400, context.Canceled); got < 0.3 {
		t.Errorf("slow, removed and listed again, got %.2f of the picks; want about half: its old latency must be gone", got)
	}
}

func TestInFlightCountsNeverLeak(t *testing.T) {
	t.Run("more calls than slots", func(t *testing.T) {
		b := build(t)
		s := set("only")
		b.Update(s)
		var held []*kernel.Instance
		for range 200 {
			held = append(held, pick(t, b, s))
		}
		if n, untimed := leastload.InFlight(b, "only"); n != 200 || untimed != 200-64 {
			t.Errorf("200 calls out: in flight %d (%d untimed); want 200 (136 untimed)", n, untimed)
		}
		for _, p := range held {
			b.Done(p, nil)
		}
		if n, untimed := leastload.InFlight(b, "only"); n != 0 || untimed != 0 {
			t.Errorf("after every Done: in flight %d (%d untimed); want 0", n, untimed)
		}
	})
	t.Run("instance changed twice while its calls were out", func(t *testing.T) {
		b := build(t)
		s := set("a")
		b.Update(s)
		var held []*kernel.Instance
		for range 10 {
			held = append(held, pick(t, b, s))
		}
		moved := set("a")
		moved[0].Address = "elsewhere.invalid:7000"
		b.Update(moved)
		for range 5 {
			held = append(held, pick(t, b, moved))
		}
		reported := set("a")
		reported[0].Address = moved[0].Address
		reported[0].Load = kernel.Load{InFlight: 3, QPS: 10}
		b.Update(reported)
		if p := pick(t, b, reported); p.Address != moved[0].Address || p.Load != reported[0].Load {
			t.Errorf("after Updates, Pick = %+v; want the instance as last listed", *p)
		} else {
			held = append(held, p)
		}
		for i, p := range held {
			if p.ID != "a" || (i < 10 && p.Address != s[0].Address) {
				t.Fatalf("a held pick changed to %+v after Updates", *p)
			}
			b.Done(p, nil)
		}
		if n, untimed := leastload.InFlight(b, "a"); n != 0 || untimed != 0 {
			t.Errorf("after every Done: in flight %d (%d untimed); want 0", n, untimed)
		}
	})
	t.Run("Done of an instance removed and listed again", func(t *testing.T) {
		b := build(t)
		s := set("a", "b")
		b.Update(s)
		var held []*kernel.Instance
		for range 6 {
			held = append(held, pick(t, b, s))
		}
		b.Update(set("b"))
		back := set("a", "b")
		b.Update(back)
		mine := pick(t, b, back)
		for _, p := range held {
			b.Done(p, nil)
		}
		want := int64(0)
		if mine.ID == "a" {
			want = 1
		}
		if n, _ := leastload.InFlight(b, "a"); n != want {
			t.Errorf("a, listed again with %d call out, counts %d after the old calls' Done; want %d", want, n, want)
		}
		b.Done(mine, nil)
	})
}

func TestExpNegMatchesMathExp(t *testing.T) {
	for _, x := range []float64{0, 1e-9, 1e-6, 1e-3, 0.005, 0.00999, 0.01, 0.5, 1, 3, 50, 1e6} {
		got, want := leastload.ExpNeg(x), math.Exp(-x)
		if math.Abs(got-want) > 1e-9*want && math.Abs(got-want) > 1e-300 {
			t.Errorf("expNeg(%g) = %.12g, math.Exp(-%g) = %.12g", x, got, x, want)
		}
	}
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		key     string
	}{
		{"zero decay", map[string]any{"decay": "0s"}, "decay"},
		{"negative decay", map[string]any{"decay": "-1s"}, "decay"},
		{"decay not a duration", map[string]any{"decay": "soon"}, "decay"},
		{"unknown option", map[string]any{"choices": 3}, "choices"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kernel.NewBalancer(leastload.Name, tc.options, "svc.yaml")
			if err == nil {
				t.Fatalf("NewBalancer with %v succeeded; want an error", tc.options)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("option %q", tc.key)) {
				t.Errorf("error %q does not name option %q", err, tc.key)
			}
		})
	}
}

func TestRegisteredUnderName(t *testing.T) {
	b, err := kernel.NewBalancer(leastload.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewBalancer(%q): %v", leastload.Name, err)
	}
	if _, ok := b.(*leastload.Balancer); !ok {
		t.Errorf("NewBalancer(%q) built a %T", leastload.Name, b)
	}
}

func TestNoInstances(t *testing.T) {
	for name, update := range map[string]func(*leastload.Balancer){
		"never updated":     func(*leastload.Balancer) {},
		"empty set":         func(b *leastload.Balancer) { b.Update([]kernel.Instance{}) },
		"empty after a set": func(b *leastload.Balancer) { b.Update(set("a", "b")); b.Update(nil) },
	} {
		t.Run(name, func(t *testing.T) {
			b := build(t)
			update(b)
			p, err := b.Pick(context.Background(), info)
			if p != nil || !errors.Is(err, kernel.ErrNoInstances) {
				t.Fatalf("Pick = %v, %v; want nil and an error wrapping kernel.ErrNoInstances", p, err)
			}
			if !strings.Contains(err.Error(), "least-load") || !strings.Contains(err.Error(), "Echo.Say") {
				t.Errorf("error %q does not name the balancer and the method", err)
			}
			b.Done(nil, nil) // no panic
		})
	}
}

func TestPickAndDoneDoNotAllocate(t *testing.T) {
	b := build(t)
	b.Update(set("a", "b", "c", "d"))
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		p, err := b.Pick(ctx, info)
		if err != nil {
			t.Fatal(err)
		}
		b.Done(p, nil)
	})
	if allocs != 0 {
		t.Errorf("Pick and Done: %.1f allocations per call, want 0", allocs)
	}
}

func BenchmarkPickDone(b *testing.B) {
	for _, n := range []int{8, 1000} {
		b.Run(fmt.Sprint(n, "instances"), func(b *testing.B) {
			bal := build(b)
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprint("i", i)
			}
			bal.Update(set(ids...))
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p, err := bal.Pick(ctx, info)
					if err != nil {
						b.Fatal(err)
					}
					bal.Done(p, nil)
				}
			})
		})
	}
}

// With peak, one slow call after the first 64 makes an instance as slow as
// that call; without, it enters with its small weight.
func TestPeakOption(t *testing.T) {
	for _, peak := range []bool{false, true} {
		t.Run(fmt.Sprint("peak ", peak), func(t *testing.T) {
			b, err := leastload.New(leastload.Options{Decay: kernel.Duration(10 * time.Second), Peak: peak})
			if err != nil {
				t.Fatal(err)
			}
			s := set("a", "b")
			b.Update(s)
			for range 80 { // while a is not measured, it compares by calls in flight
				measure(t, b, s, "b", 5*time.Millisecond)
			}
			for range 80 {
				measure(t, b, s, "a", 0)
			}
			measure(t, b, s, "a", 30*time.Millisecond) // one hiccup of a
			got := share(t, b, s, "a", 200, context.Canceled)
			if peak && got > 0 {
				t.Errorf("peak: after a call of 30ms, a got %.2f of the picks beside b at 5ms; want none", got)
			}
			if !peak && got < 0.99 {
				t.Errorf("no peak: after one call of 30ms among 80 fast ones, a got %.2f of the picks beside b at 5ms; want all", got)
			}
		})
	}
}

// Two instances listed under one ID at different addresses are two
// servers (Consul lists a service another program registered as "web" on
// each of its nodes under that one ID): each gets calls, and each is
// judged by its own. One listed twice at one address is one instance.
func TestInstancesSharingAnIDAtDifferentAddressesAreBothPicked(t *testing.T) {
	b := build(t)
	s := []kernel.Instance{
		{Service: "web", ID: "web", Address: "10.0.0.1:80"},
		{Service: "web", ID: "web", Address: "10.0.0.2:80"},
	}
	b.Update(s)
	got := map[string]int{}
	for range 400 {
		p := pick(t, b, s)
		got[p.Address]++
		b.Done(p, context.Canceled)
	}
	for _, in := range s {
		if got[in.Address] < 100 {
			t.Errorf("picks by address: %v; want about half of 400 to each (%s got %d)", got, in.Address, got[in.Address])
		}
	}
	// A slow one is judged apart from its twin.
	slow := s[0]
	for range 1000 {
		p := pick(t, b, s)
		if p.Address != slow.Address {
			b.Done(p, context.Canceled)
			continue
		}
		time.Sleep(30 * time.Millisecond)
		b.Done(p, nil)
		break
	}
	for range 1000 {
		p := pick(t, b, s)
		if p.Address == slow.Address {
			b.Done(p, context.Canceled)
			continue
		}
		b.Done(p, nil)
		break
	}
	clear(got)
	for range 300 {
		p := pick(t, b, s)
		got[p.Address]++
		b.Done(p, context.Canceled)
	}
	if got[slow.Address] > 0 {
		t.Errorf("picks by address after %s was slow: %v; want none to it", slow.Address, got)
	}
}

// An instance's load reports change it in every Update (a server reports
// every load_report_interval while busy): its calls still out must stay
// counted however many reports come meanwhile, and end when Done.
func TestCallsOutlastingLoadReportsStayInFlight(t *testing.T) {
	b := build(t)
	s := set("a")
	b.Update(s)
	var held []*kernel.Instance
	for range 10 {
		held = append(held, pick(t, b, s))
	}
	for i := range 5 {
		r := set("a")
		r[0].Load = kernel.Load{InFlight: int64(10 + i), QPS: 5}
		b.Update(r)
		if n, _ := leastload.InFlight(b, "a"); n != 10 {
			t.Fatalf("after %d load report(s), in flight %d; want the 10 calls still out", i+1, n)
		}
	}
	for _, p := range held {
		b.Done(p, nil)
	}
	if n, untimed := leastload.InFlight(b, "a"); n != 0 || untimed != 0 {
		t.Errorf("after every Done: in flight %d (%d untimed); want 0", n, untimed)
	}
}

// A busy instance whose reports keep coming must not look idle to P2C: its
// calls still out weigh against it.
func TestBusyInstanceStaysBusyAcrossLoadReports(t *testing.T) {
	b := build(t)
	s := set("busy")
	b.Update(s)
	var held []*kernel.Instance
	for range 20 {
		held = append(held, pick(t, b, s))
	}
	// idle joins, and busy reports its load twice, as two
	// load_report_intervals bring.
	for i := range 2 {
		r := set("busy", "idle")
		r[0].Load = kernel.Load{InFlight: int64(20 + i), QPS: 1}
		b.Update(r)
		s = r
	}
	if got := share(t, b, s, "busy", 200, context.Canceled); got > 0 {
		t.Errorf("busy, with 20 calls out, got %.2f of the picks after its load reports; want none", got)
	}
	for _, p := range held {
		b.Done(p, context.Canceled)
	}
}

// Picks and Dones racing Updates that change the instance (its load
// reports) leave no call counted once every call has ended.
func TestInFlightCountsSettleUnderConcurrentLoadReports(t *testing.T) {
	b := build(t)
	b.Update(set("a"))
	stop := make(chan struct{})
	updates := make(chan struct{})
	go func() {
		defer close(updates)
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := set("a")
			r[0].Load = kernel.Load{InFlight: i, QPS: 1}
			b.Update(r)
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			var held []*kernel.Instance
			for i := range 3000 {
				p, err := b.Pick(context.Background(), info)
				if err != nil {
					errs <- err
					return
				}
				held = append(held, p)
				if i%3 == 2 { // a few calls out at a time, across Updates
					for _, h := range held {
						b.Done(h, nil)
					}
					held = held[:0]
				}
			}
			for _, h := range held {
				b.Done(h, nil)
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	<-updates
	if n, untimed := leastload.InFlight(b, "a"); n != 0 || untimed != 0 {
		t.Errorf("after every Done: in flight %d (%d untimed); want 0", n, untimed)
	}
}
