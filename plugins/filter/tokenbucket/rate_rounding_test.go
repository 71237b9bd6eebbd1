package tokenbucket

import (
	"context"
	"testing"
	"time"
)

// The interval between tokens is a whole number of nanoseconds: rounded
// down, a high rate (6e8/s: 1.67ns a token) would become 1ns a token and
// admit two thirds more calls than configured. Rounded up, the bucket
// never admits more than its rate.
func TestHighRateAdmitsNoMoreThanItsRate(t *testing.T) {
	for _, rate := range []float64{6e8, 3e8, 7e7, 3e6} {
		r := newRig(t, map[string]any{"rate": rate, "burst": 1})
		const window = 10 * time.Microsecond
		admitted := 0
		for r.clock = 0; r.clock <= window; r.clock++ {
			if _, err := r.call(context.Background(), "Echo.Who"); err == nil {
				admitted++
			}
		}
		if most := int(rate*window.Seconds()) + 1; admitted > most {
			t.Errorf("rate %v/s, burst 1: %d calls admitted in %v, want at most %d", rate, admitted, window, most)
		}
	}
}
