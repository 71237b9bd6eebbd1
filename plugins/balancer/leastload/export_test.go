package leastload

// InFlight returns the calls the balancer counts in flight to the instance
// with id (the first listed, should several share it), and how many of
// them are untimed; -1, -1 if it keeps no state of it.
func InFlight(b *Balancer, id string) (all, untimed int64) {
	t := b.table.Load()
	if t == nil {
		return -1, -1
	}
	for i := range t.set {
		if t.set[i].ID == id {
			p := t.peers[i]
			return p.inflight.Load(), p.untimed.Load()
		}
	}
	return -1, -1
}

// ExpNeg exposes the fast exp(-x) for its test.
var ExpNeg = expNeg
