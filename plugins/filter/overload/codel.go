package overload

import "math"

// codel is CoDel's drop state machine (RFC 8289, as folly's Codel and the
// Linux qdisc run it) over the sojourn times of calls leaving the filter's
// queue. The caller holds a lock around every method. Times are ns.
type codel struct {
	target, interval int64

	firstAbove int64 // when sojourn may first count as persistently above target; 0: it is below
	dropping   bool
	dropNext   int64 // in the dropping state, when the next drop is due
	count      int   // drops since dropping began (carried over a quick re-entry)
	lastCount  int
}

// dequeue is told of a call leaving the queue at now after sojourn ns and
// reports whether to drop (reject) it. Drops begin once sojourn has stayed
// at or above target for a whole interval; then come at intervals of
// interval/√count, closer and closer while the delay persists; and stop
// with the first call below target.
func (c *codel) dequeue(now, sojourn int64) bool {
	okToDrop := false
	switch {
	case sojourn < c.target:
		c.firstAbove = 0
	case c.firstAbove == 0:
		c.firstAbove = now + c.interval
	case now >= c.firstAbove:
		okToDrop = true
	}
	if c.dropping {
		if !okToDrop {
			c.dropping = false
			return false
		}
		if now >= c.dropNext {
			c.count++
			c.dropNext = c.controlLaw(c.dropNext)
			return true
		}
		return false
	}
	if !okToDrop {
		return false
	}
	c.dropping = true
	// Back in the dropping state soon after leaving it: start from about
	// the drop rate that was last needed, not from scratch.
	if delta := c.count - c.lastCount; delta > 1 && now-c.dropNext < 16*c.interval {
		c.count = delta
	} else {
		c.count = 1
	}
	c.lastCount = c.count
	c.dropNext = c.controlLaw(now)
	return true
}

// empty is told that the queue emptied: the delay is gone.
func (c *codel) empty() {
	c.firstAbove = 0
	c.dropping = false
}

func (c *codel) controlLaw(t int64) int64 {
	return t + int64(float64(c.interval)/math.Sqrt(float64(c.count)))
}
