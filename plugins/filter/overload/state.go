package overload

import "github.com/kernrpc/kernrpc/kernel"

var _ kernel.StateReporter = (*Filter)(nil)

// shedReason is why a call was rejected: the values of overload_shed_total's
// reason label.
type shedReason uint8

const (
	shedLimit      shedReason = iota // mode gradient: the learned limit was in flight
	shedQueueFull                    // mode codel: limit calls already waited
	shedQueueDelay                   // mode codel: CoDel shed it, or would have made it wait while shedding
	numShedReasons
)

var shedReasons = [numShedReasons]string{shedLimit: "limit", shedQueueFull: "queue-full", shedQueueDelay: "queue-delay"}

// ReportState reports the limit learnt, the calls in flight and waiting,
// and the calls shed by reason. The filter has no labels of its own: one
// server has one.
func (f *Filter) ReportState(emit func(kernel.Reading)) {
	emit(kernel.Reading{Name: "overload_limit", Help: "The concurrency limit learnt from latency: calls admitted at once.",
		Kind: kernel.Gauge, Value: float64(f.limit.Load())})
	emit(kernel.Reading{Name: "overload_calls_in_flight", Help: "Calls the filter admitted that have not ended yet.",
		Kind: kernel.Gauge, Value: float64(f.inflight.Load())})
	queued := 0
	if f.cd != nil {
		f.mu.Lock()
		queued = len(f.queue)
		f.mu.Unlock()
	}
	emit(kernel.Reading{Name: "overload_calls_queued", Help: "Calls waiting for a slot now (mode codel; always 0 in mode gradient).",
		Kind: kernel.Gauge, Value: float64(queued)})
	for r, name := range shedReasons {
		emit(kernel.Reading{Name: "overload_shed_total", Help: "Calls rejected over capacity, by why: limit, queue-full or queue-delay.",
			Kind: kernel.Counter, Labels: []kernel.Label{{Name: "reason", Value: name}}, Value: float64(f.shed[r].Load())})
	}
}
