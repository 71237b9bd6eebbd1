package leastload

// InFlight returns the calls the balancer counts in flight to the instance
// with id, and how many of them are untimed; -1, -1 if it keeps no state
// of it.
func InFlight(b *Balancer, id string) (all, untimed int64) {
	t := b.table.Load()
	if t == nil || t.byID[id] == nil {
		return -1, -1
	}
	p := t.byID[id]
	return p.inflight.Load(), p.untimed.Load()
}

// ExpNeg exposes the fast exp(-x) for its test.
var ExpNeg = expNeg
