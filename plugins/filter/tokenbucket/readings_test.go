package tokenbucket

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// readings collects what the filter reports, by name and bucket label,
// checking that each reading has help and a bucket label only.
func readings(t *testing.T, f *Filter) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f.ReportState(func(r kernel.Reading) {
		if r.Help == "" || len(r.Labels) != 1 || r.Labels[0].Name != "bucket" {
			t.Errorf("reading %+v: want help and one label, bucket", r)
		}
		if want := map[string]kernel.ReadingKind{"token_bucket_tokens": kernel.Gauge, "token_bucket_rejected_total": kernel.Counter}; want[r.Name] != r.Kind {
			t.Errorf("reading %s of kind %d", r.Name, r.Kind)
		}
		k := r.Name + "{" + r.Labels[0].Value + "}"
		if _, dup := out[k]; dup {
			t.Errorf("series %s reported twice", k)
		}
		out[k] = r.Value
	})
	return out
}

func wantReadings(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-9 {
			t.Errorf("%s = %v (reported: %v), want %v", k, g, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("readings %v, want only %v", got, want)
	}
}

// The tokens fall with each call, a rejection is counted, and the bucket
// refills at the rate, in fractions of a token, up to burst.
func TestReadingsOfTheGlobalBucket(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 3})
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 3, "token_bucket_rejected_total{global}": 0})
	r.passes(2, "Echo.A")
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 1, "token_bucket_rejected_total{global}": 0})
	r.passes(1, "Echo.B")
	r.rejected("Echo.A", 100)
	r.rejected("Echo.B", 100)
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 0, "token_bucket_rejected_total{global}": 2})
	r.clock += 150 * time.Millisecond
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 1.5, "token_bucket_rejected_total{global}": 2})
	r.clock += time.Hour
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 3, "token_bucket_rejected_total{global}": 2})
}

// Scope method reports one bucket per method called, and the overflow
// bucket once methods past the bound share it.
func TestReadingsPerMethod(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 1, "burst": 2, "scope": "method"})
	if got := readings(t, r.f); len(got) != 0 {
		t.Errorf("readings before any call: %v", got)
	}
	r.passes(2, "Echo.A")
	r.rejected("Echo.A", 1000)
	r.passes(1, "Echo.B")
	wantReadings(t, readings(t, r.f), map[string]float64{
		"token_bucket_tokens{Echo.A}": 0, "token_bucket_rejected_total{Echo.A}": 1,
		"token_bucket_tokens{Echo.B}": 1, "token_bucket_rejected_total{Echo.B}": 0,
	})
	for i := range maxBuckets {
		r.passes(1, "M"+strconv.Itoa(i))
	}
	got := readings(t, r.f)
	if len(got) != 2*maxBuckets+2 {
		t.Errorf("%d readings, want two for each of %d buckets and the overflow's", len(got), maxBuckets)
	}
	// Echo.A and Echo.B hold two of the places: M1022 and M1023 took the
	// overflow's two tokens.
	if _, own := got["token_bucket_tokens{M1022}"]; own || got["token_bucket_tokens{_other}"] != 0 || got["token_bucket_tokens{M0}"] != 1 {
		t.Errorf("overflow %v, M0 %v, M1022 a bucket of its own: %v; want 0 and 1 token, and no", got["token_bucket_tokens{_other}"], got["token_bucket_tokens{M0}"], own)
	}
}

// In mode backoff, a token reserved ahead leaves the bucket at 0, not
// below; a call rejected for waiting too long is counted.
func TestReadingsInBackoff(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 10, "burst": 1, "mode": "backoff", "max_wait": "150ms"})
	r.f.sleep = func(context.Context, time.Duration) error { return nil } // leave the clock
	r.passes(2, "Echo.Who")                                               // the second reserved the token 100ms away
	r.rejected("Echo.Who", 200)
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 0, "token_bucket_rejected_total{global}": 1})
	r.clock += 150 * time.Millisecond
	wantReadings(t, readings(t, r.f), map[string]float64{"token_bucket_tokens{global}": 0.5, "token_bucket_rejected_total{global}": 1})
}
