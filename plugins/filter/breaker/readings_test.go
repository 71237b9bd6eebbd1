package breaker

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// readings collects what the filter reports, by name and label values,
// and checks the contract every reading keeps: help, one kind and one
// list of label names per name.
func readings(t *testing.T, f *Filter) map[string]kernel.Reading {
	t.Helper()
	out := map[string]kernel.Reading{}
	names := map[string][]string{}
	f.ReportState(func(r kernel.Reading) {
		var ln, lv []string
		for _, l := range r.Labels {
			ln = append(ln, l.Name)
			lv = append(lv, l.Value)
		}
		if r.Help == "" || !strings.HasPrefix(r.Name, "breaker_") {
			t.Errorf("reading %+v: want a breaker_ name and help", r)
		}
		if strings.HasSuffix(r.Name, "_total") != (r.Kind == kernel.Counter) {
			t.Errorf("reading %s is of kind %d: counters, and only they, end in _total", r.Name, r.Kind)
		}
		if prev, ok := names[r.Name]; ok && !slices.Equal(prev, ln) {
			t.Errorf("reading %s has labels %v, and %v elsewhere", r.Name, ln, prev)
		}
		names[r.Name] = ln
		k := r.Name + "{" + strings.Join(lv, ",") + "}"
		if _, dup := out[k]; dup {
			t.Errorf("series %s reported twice", k)
		}
		out[k] = r
	})
	return out
}

// want checks that the series named k was reported with value v.
func want(t *testing.T, got map[string]kernel.Reading, k string, v float64) {
	t.Helper()
	r, ok := got[k]
	if !ok {
		t.Errorf("no reading %s among %d", k, len(got))
		return
	}
	if math.Abs(r.Value-v) > 1e-9 {
		t.Errorf("%s = %v, want %v", k, r.Value, v)
	}
}

// A ratio breaker reports one breaker_state series per state, 1 for the
// one it is in, through closed, open, half-open and closed again, with
// its refusals and openings counted; an untouched host's breaker stays
// closed with nothing counted.
func TestReadingsFollowTheRatioBreaker(t *testing.T) {
	r := newRig(t, small)
	if got := readings(t, r.f); len(got) != 0 {
		t.Fatalf("readings before any call: %v", got)
	}
	state := func(got map[string]kernel.Reading, host string, s State) {
		t.Helper()
		for _, other := range states {
			v := 0.0
			if other == s {
				v = 1
			}
			want(t, got, "breaker_state{Echo.Who,"+host+","+other.String()+"}", v)
		}
	}
	r.call(hostB, nil)
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	r.call(hostA, nil) // refused: open
	r.call(hostA, nil)
	got := readings(t, r.f)
	state(got, hostA, Open)
	want(t, got, "breaker_rejected_total{Echo.Who,"+hostA+"}", 2)
	want(t, got, "breaker_opened_total{Echo.Who,"+hostA+"}", 1)
	state(got, hostB, Closed)
	want(t, got, "breaker_rejected_total{Echo.Who,"+hostB+"}", 0)
	want(t, got, "breaker_opened_total{Echo.Who,"+hostB+"}", 0)
	if len(got) != 2*5 {
		t.Errorf("%d readings for two breakers, want 5 each: %v", len(got), got)
	}

	r.clock += 5 * time.Second
	r.call(hostA, nil) // the first of two probes succeeds
	state(readings(t, r.f), hostA, HalfOpen)
	r.call(hostA, errUnavailable) // the second fails: open again
	got = readings(t, r.f)
	state(got, hostA, Open)
	want(t, got, "breaker_opened_total{Echo.Who,"+hostA+"}", 2)
	r.clock += 5 * time.Second
	r.call(hostA, nil)
	r.call(hostA, nil)
	got = readings(t, r.f)
	state(got, hostA, Closed)
	want(t, got, "breaker_rejected_total{Echo.Who,"+hostA+"}", 2)
}

// The labels are the scope's key: with scope host the method is empty,
// with scope method the host is.
func TestReadingsLabelTheScopesKey(t *testing.T) {
	for scope, k := range map[string]string{ScopeHost: "," + hostA, ScopeMethod: "Echo.Who,"} {
		r := newRig(t, map[string]any{"scope": scope, "min_requests": 1})
		r.call(hostA, errUnavailable)
		got := readings(t, r.f)
		want(t, got, "breaker_state{"+k+",open}", 1)
		want(t, got, "breaker_opened_total{"+k+"}", 1)
	}
}

// Adaptive throttling reports its rejection probability, as the formula
// gives it from the window, and its local rejections; no state.
func TestReadingsOfAdaptiveThrottling(t *testing.T) {
	r := newRig(t, map[string]any{"mode": "sre", "min_requests": 10, "k": 2})
	for i := range 10 {
		var err error
		if i >= 2 {
			err = errUnavailable
		}
		r.call(hostA, err)
	}
	got := readings(t, r.f)
	want(t, got, "breaker_reject_probability{Echo.Who,"+hostA+"}", 6.0/11)
	want(t, got, "breaker_rejected_total{Echo.Who,"+hostA+"}", 0)
	r.draw = 0 // below p: rejected
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("draw 0 at p 6/11: %v, want a local rejection", err)
	}
	got = readings(t, r.f)
	want(t, got, "breaker_rejected_total{Echo.Who,"+hostA+"}", 1)
	want(t, got, "breaker_reject_probability{Echo.Who,"+hostA+"}", 7.0/12) // 11 requests, 2 accepts
	if len(got) != 2 {
		t.Errorf("readings of one throttle: %v, want its probability and rejections only", got)
	}
	// Below min_requests (the window forgot) it rejects nothing: p is 0.
	r.clock += 10 * time.Second
	want(t, readings(t, r.f), "breaker_reject_probability{Echo.Who,"+hostA+"}", 0)
}
