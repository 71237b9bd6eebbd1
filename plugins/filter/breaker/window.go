package breaker

// window counts recent calls and how many of them were marked: failures
// in mode ratio, accepted requests in mode sre. It is a ring of the last
// size calls (a count window) or of buckets covering the last span (a
// time window); either way it keeps running sums, so that adding and
// summing cost the same however large it is. Its owner serializes access.
type window struct {
	total, marked int
	// count window
	ring []bool
	pos  int
	// time window
	buckets []bucket
	width   int64
	epoch   int64 // the newest bucket's: time / width
}

type bucket struct {
	total, marked int
}

func newWindow(c *config) window {
	if c.count {
		return window{ring: make([]bool, c.size)}
	}
	return window{buckets: make([]bucket, c.buckets), width: c.width}
}

// timed reports whether the window needs the time to add or sum.
func (w *window) timed() bool { return w.buckets != nil }

// add counts one call at now (ns). A call older than the window is not
// counted.
func (w *window) add(now int64, marked bool) {
	if w.ring != nil {
		if w.total == len(w.ring) {
			if w.ring[w.pos] {
				w.marked--
			}
		} else {
			w.total++
		}
		w.ring[w.pos] = marked
		if marked {
			w.marked++
		}
		if w.pos++; w.pos == len(w.ring) {
			w.pos = 0
		}
		return
	}
	e := now / w.width
	w.roll(e)
	if e <= w.epoch-int64(len(w.buckets)) {
		return
	}
	b := &w.buckets[e%int64(len(w.buckets))]
	b.total++
	w.total++
	if marked {
		b.marked++
		w.marked++
	}
}

// roll moves the window forward to epoch e, dropping the buckets that
// fall out of it.
func (w *window) roll(e int64) {
	if e <= w.epoch {
		return
	}
	n := int64(len(w.buckets))
	if e-w.epoch >= n {
		w.reset()
		w.epoch = e
		return
	}
	for w.epoch < e {
		w.epoch++
		b := &w.buckets[w.epoch%n]
		w.total -= b.total
		w.marked -= b.marked
		*b = bucket{}
	}
}

// sums returns how many calls the window holds at now, and how many of
// them were marked.
func (w *window) sums(now int64) (total, marked int) {
	if w.buckets != nil {
		w.roll(now / w.width)
	}
	return w.total, w.marked
}

// reset forgets every call.
func (w *window) reset() {
	w.total, w.marked, w.pos = 0, 0, 0
	clear(w.ring)
	clear(w.buckets)
}
