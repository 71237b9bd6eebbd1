package overload

import "math"

// The constants of the gradient limit, as Netflix's concurrency-limits
// Gradient2Limit has them. None depends on the service: they are ratios
// and counts of windows, and the window is sized by the limit itself.
const (
	// tolerance is how far short-term latency may rise over the long-term
	// average before the limit is cut: a ratio under 1.5 leaves it alone.
	tolerance = 1.5
	// smoothing is the weight of each window's new limit against the old.
	smoothing = 0.2
	// queueSize is what each window adds to the unsmoothed limit while
	// latency holds, so the limit grows by queueSize·smoothing (0.8) a
	// window: it probes for capacity, and is the headroom that absorbs a
	// burst without a rejection.
	queueSize = 4
	// longWindows is the span, in windows, of the long-term average; its
	// first warmupWindows windows are a plain mean.
	longWindows   = 600
	warmupWindows = 10
	// minWindowSamples is the fewest calls a window holds; it holds at
	// least as many as the limit, about one round trip of every call in
	// flight, so that its mean is not one slow call.
	minWindowSamples = 10
	// maxWindowNs closes a window of fewer calls than that once it is this
	// old, so that a quiet server still learns.
	maxWindowNs = 1e9
)

// gradient is the learned concurrency limit: the caller holds a lock
// around every method. Times are nanoseconds on the filter's clock.
type gradient struct {
	limit    float64 // the estimate; calls are admitted below floor(limit)
	min, max float64

	long    float64 // long-term mean latency, ns; 0 before the first window
	windows int     // windows seen, up to warmupWindows

	// The window being filled.
	start   int64
	samples int
	sum     float64 // of latencies, ns
	peak    int     // the most calls in flight seen in it
}

func newGradient(initial, min, max int) gradient {
	return gradient{limit: float64(initial), min: float64(min), max: float64(max), start: -1}
}

// sample records one call that took rtt ns with inflight calls in flight
// (itself included) and reports whether the window closed and the limit
// was updated.
func (g *gradient) sample(now, rtt int64, inflight int) bool {
	if g.start < 0 {
		g.start = now
	}
	g.samples++
	g.sum += float64(max(rtt, 1))
	g.peak = max(g.peak, inflight)
	if g.samples < max(minWindowSamples, int(g.limit)) && now-g.start < maxWindowNs {
		return false
	}
	g.update(g.sum/float64(g.samples), g.peak)
	g.start, g.samples, g.sum, g.peak = now, 0, 0, 0
	return true
}

// update is Gradient2's step for one window whose mean latency was short
// and whose peak concurrency was peak.
func (g *gradient) update(short float64, peak int) {
	switch {
	case g.windows < warmupWindows:
		g.windows++
		g.long += (short - g.long) / float64(g.windows)
	default:
		g.long += (short - g.long) * 2 / (longWindows + 1)
	}
	// Latency fell well below the long-term mean (a slow dependency
	// recovered, say): let the mean come down faster than its span would.
	if g.long/short > 2 {
		g.long *= 0.95
	}
	// A server that does not use half its limit says nothing about
	// whether it could take more: leave the limit be.
	if float64(peak) < g.limit/2 {
		return
	}
	grad := math.Max(0.5, math.Min(1, tolerance*g.long/short))
	next := g.limit*grad + queueSize
	next = g.limit*(1-smoothing) + next*smoothing
	g.limit = math.Max(g.min, math.Min(g.max, next))
}

// admits is the number of calls that may be in flight.
func (g *gradient) admits() int64 { return int64(g.limit) }
