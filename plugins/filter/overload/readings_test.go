package overload

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// readings collects what the filter reports, by name and reason label.
func readings(t *testing.T, f *Filter) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f.ReportState(func(r kernel.Reading) {
		k := r.Name
		switch {
		case r.Help == "":
			t.Errorf("reading %s has no help", r.Name)
		case r.Name == "overload_shed_total" && (r.Kind != kernel.Counter || len(r.Labels) != 1 || r.Labels[0].Name != "reason"):
			t.Errorf("reading %+v: want a counter labelled reason", r)
		case r.Name == "overload_shed_total":
			k += "{" + r.Labels[0].Value + "}"
		case r.Kind != kernel.Gauge || len(r.Labels) != 0:
			t.Errorf("reading %+v: want a gauge without labels", r)
		}
		if _, dup := out[k]; dup {
			t.Errorf("series %s reported twice", k)
		}
		out[k] = r.Value
	})
	return out
}

func wantReadings(t *testing.T, when string, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %s = %v (reported: %v), want %v", when, k, g, ok, v)
		}
	}
	if len(got) != 6 {
		t.Errorf("%s: readings %v, want 6", when, got)
	}
}

// holder runs calls through Invoke until released.
type holder struct {
	f       *Filter
	release []chan struct{}
}

func (h *holder) hold() {
	ch := make(chan struct{})
	h.release = append(h.release, ch)
	started := make(chan struct{})
	go h.f.Invoke(context.Background(), &kernel.CallInfo{Method: "M", Side: kernel.ServerSide}, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
		close(started)
		<-ch
		return "ok", nil
	})
	<-started
}

func (h *holder) admit() error {
	return h.f.Admit(context.Background(), &kernel.CallInfo{Method: "M", Side: kernel.ServerSide})
}

func build(t *testing.T, opts map[string]any) (*Filter, *atomic.Int64) {
	t.Helper()
	flt, err := Factory.Build(opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := flt.(*Filter)
	var clock atomic.Int64
	f.now = clock.Load
	return f, &clock
}

// Mode gradient: the limit, the calls in flight, and each call over the
// limit counted as shed by the limit.
func TestReadingsInModeGradient(t *testing.T) {
	f, _ := build(t, map[string]any{"initial_limit": 2, "min_limit": 2, "max_limit": 5})
	wantReadings(t, "idle", readings(t, f), map[string]float64{"overload_limit": 2, "overload_calls_in_flight": 0, "overload_calls_queued": 0,
		"overload_shed_total{limit}": 0, "overload_shed_total{queue-full}": 0, "overload_shed_total{queue-delay}": 0})
	h := &holder{f: f}
	h.hold()
	h.hold()
	for range 3 {
		if err := h.admit(); kernel.CodeOf(err) != kernel.ResourceExhausted {
			t.Fatalf("over the limit: %v", err)
		}
	}
	wantReadings(t, "2 in flight, 3 rejected", readings(t, f), map[string]float64{"overload_limit": 2, "overload_calls_in_flight": 2,
		"overload_calls_queued": 0, "overload_shed_total{limit}": 3, "overload_shed_total{queue-full}": 0})
	for _, ch := range h.release {
		close(ch)
	}
	waitInflight(t, f, 0)
	if got := readings(t, f)["overload_calls_in_flight"]; got != 0 {
		t.Errorf("in flight after the calls ended: %v", got)
	}
}

// Mode codel: a waiting call is queued, one finding the queue full is
// shed as queue-full, and one CoDel sheds after its wait, or while it
// sheds, as queue-delay.
func TestReadingsInModeCodel(t *testing.T) {
	f, clock := build(t, map[string]any{"mode": "codel", "initial_limit": 1, "min_limit": 1, "max_limit": 1})
	h := &holder{f: f}
	h.hold()
	admitted := make(chan error, 1)
	go func() { admitted <- h.admit() }()
	waitQueued(t, f, 1)
	if err := h.admit(); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a full queue: %v", err)
	}
	wantReadings(t, "1 in flight, 1 waiting, 1 rejected", readings(t, f), map[string]float64{"overload_limit": 1, "overload_calls_in_flight": 1,
		"overload_calls_queued": 1, "overload_shed_total{queue-full}": 1, "overload_shed_total{queue-delay}": 0})
	clock.Add(6 * ms)
	close(h.release[0]) // above target, but not for an interval: admitted
	if err := <-admitted; err != nil {
		t.Fatal(err)
	}
	h.hold()
	go func() { admitted <- h.admit() }()
	waitQueued(t, f, 1)
	clock.Add(101 * ms)
	close(h.release[1]) // above target for an interval: shed
	if err := <-admitted; kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a call that waited 101ms above target: %v", err)
	}
	if err := h.admit(); err != nil {
		t.Fatal(err)
	}
	h.hold()
	if err := h.admit(); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("shedding, no slot: %v", err)
	}
	wantReadings(t, "after shedding", readings(t, f), map[string]float64{"overload_calls_in_flight": 1, "overload_calls_queued": 0,
		"overload_shed_total{limit}": 0, "overload_shed_total{queue-full}": 1, "overload_shed_total{queue-delay}": 2})
	close(h.release[2])
	waitInflight(t, f, 0)
}
