package breaker

import "github.com/kernrpc/kernrpc/kernel"

var _ kernel.StateReporter = (*Filter)(nil)

// figures are what one circuit reports of itself.
type figures struct {
	state    State
	rejected uint64  // calls it refused
	opened   uint64  // times it opened (mode ratio)
	peer     uint64  // of which another client's opening caused (share: registry)
	rejectP  float64 // the probability a call is rejected now (mode sre)
}

func (c *ratioCircuit) figures(func() int64) figures {
	return figures{state: c.state(), rejected: c.rejected.Load(), opened: c.opened.Load(), peer: c.peerOpened.Load()}
}

func (c *throttle) figures(now func() int64) figures {
	c.mu.Lock()
	var at int64
	if c.win.timed() {
		at = now()
	}
	requests, accepts := c.win.sums(at)
	c.mu.Unlock()
	p := 0.0
	if requests >= c.cfg.min {
		p = rejectProbability(requests, accepts, c.cfg.k)
	}
	return figures{state: Closed, rejected: c.rejected.Load(), rejectP: p}
}

// The readings' names and help, one place for both modes.
const (
	readingState    = "breaker_state"
	readingRejected = "breaker_rejected_total"
	readingOpened   = "breaker_opened_total"
	readingRejectP  = "breaker_reject_probability"
	readingPeer     = "breaker_peer_opened_total"
	readingDropped  = "breaker_share_dropped_total"
	readingFailed   = "breaker_share_failed_total"

	helpState    = "1 for the state the breaker of a method on a host is in (closed, open, half-open), 0 for the others."
	helpRejected = "Attempts the breaker refused: while open or half-open (mode ratio), or throttled locally (mode sre)."
	helpOpened   = "Times the breaker opened, from closed or from a failed probe."
	helpRejectP  = "The probability with which adaptive throttling (mode sre) rejects a call now, from 0 to 1."
	helpPeer     = "Times the breaker opened because another client sharing its state through the registry opened its own (share: registry); counted in breaker_opened_total too."
	helpDropped  = "Openings and closings not published to the registry because the filter's queue to it was full (share: registry)."
	helpFailed   = "Openings and closings the registry failed to store (share: registry)."
)

// states are the values of breaker_state's state label, in order.
var states = [...]State{Closed, Open, HalfOpen}

// ReportState reports, for every breaker the filter holds (one per key
// its scope gives; idle ones are dropped with their counts), its state
// (mode ratio) or rejection probability (mode sre), and its counts. The
// method and host labels are the key's: the part the scope leaves out
// is empty.
func (f *Filter) ReportState(emit func(kernel.Reading)) {
	f.store.each(func(k key, c circuit) {
		fig := c.figures(f.now)
		if f.cfg.sre {
			emit(kernel.Reading{Name: readingRejectP, Help: helpRejectP, Kind: kernel.Gauge, Labels: keyLabels(k), Value: fig.rejectP})
		} else {
			for _, s := range states {
				v := 0.0
				if s == fig.state {
					v = 1
				}
				emit(kernel.Reading{Name: readingState, Help: helpState, Kind: kernel.Gauge,
					Labels: append(keyLabels(k), kernel.Label{Name: "state", Value: s.String()}), Value: v})
			}
			emit(kernel.Reading{Name: readingOpened, Help: helpOpened, Kind: kernel.Counter, Labels: keyLabels(k), Value: float64(fig.opened)})
			if f.share != nil {
				emit(kernel.Reading{Name: readingPeer, Help: helpPeer, Kind: kernel.Counter, Labels: keyLabels(k), Value: float64(fig.peer)})
			}
		}
		emit(kernel.Reading{Name: readingRejected, Help: helpRejected, Kind: kernel.Counter, Labels: keyLabels(k), Value: float64(fig.rejected)})
	})
	if f.share != nil {
		emit(kernel.Reading{Name: readingDropped, Help: helpDropped, Kind: kernel.Counter, Value: float64(f.share.dropped.Load())})
		emit(kernel.Reading{Name: readingFailed, Help: helpFailed, Kind: kernel.Counter, Value: float64(f.share.failed.Load())})
	}
}

// keyLabels are a fresh slice per reading, with room for one more label:
// a receiver may keep what it is given.
func keyLabels(k key) []kernel.Label {
	l := make([]kernel.Label, 2, 3)
	l[0] = kernel.Label{Name: "method", Value: k.method}
	l[1] = kernel.Label{Name: "host", Value: k.host}
	return l
}
