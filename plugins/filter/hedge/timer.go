package hedge

import (
	"os"
	"sync"
	"time"
)

// Hedge timers. Go's runtime timers fire up to a millisecond late in a
// process whose goroutines are all waiting (on Linux the runtime's idle
// wait counts in milliseconds), which would turn a hedge delay of 200µs
// into 1.2ms and hedging useless for fast services. So on Linux, delays
// shorter than preciseBelow run on a clock of the filter's own: one
// timerfd, set to the earliest deadline of the calls waiting on it, that
// a goroutine reads through the runtime's poller, which wakes it as soon
// as the kernel says the time has come (within the kernel's 50µs timer
// slack). Longer delays, and every delay elsewhere, use runtime timers.
const preciseBelow = 10 * time.Millisecond

// clock is the precise timer. Its heap holds the calls waiting for their
// delay, earliest first; the timerfd is set for the first of them or, when
// that one left the heap, for a deadline before it. Arming costs a syscall
// only when the call is first and earlier than the timerfd's deadline: a
// client making calls one after another arms the timerfd once per delay,
// not once per call.
type clock struct {
	base time.Time // deadlines are ns since base, on the monotonic clock

	mu     sync.Mutex
	fd     int
	file   *os.File // the timerfd, read through the poller
	heap   []*call
	set    int64 // the deadline the timerfd is set for; 0: none
	due    []*call
	closed bool
}

func (k *clock) now() int64 { return int64(time.Since(k.base)) }

// arm makes c fire after d, on the clock when it runs and d is short,
// else on c's runtime timer.
func (f *Filter) arm(c *call, d time.Duration) {
	if k := f.clock; k != nil && d < preciseBelow && k.arm(c, d) {
		c.onClock = true
		return
	}
	c.onClock = false
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.fire)
		return
	}
	c.timer.Reset(d)
}

// disarm stops c's timer, reporting whether its fire is sure not to run
// for this arming (nor to be running).
func (f *Filter) disarm(c *call) (stopped bool) {
	if c.onClock {
		return f.clock.disarm(c)
	}
	return c.timer == nil || c.timer.Stop()
}

// arm puts c on the heap, setting the timerfd if c is now first; false if
// the clock is closed.
func (k *clock) arm(c *call, d time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	now := k.now()
	c.deadline = now + int64(d)
	k.push(c)
	if k.set == 0 || c.deadline < k.set {
		k.setLocked(c.deadline, now)
	}
	return true
}

// disarm takes c off the heap if it is there. The timerfd stays set: a
// syscall on every call's path costs more than the timerfd firing for
// nothing once, off it, at the deadline of the call that was first (by
// then usually a later call is first, and expire sets it for that one).
func (k *clock) disarm(c *call) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c.slot < 0 {
		return !c.popped
	}
	k.remove(c.slot)
	return true
}

// expire fires the calls whose deadline has passed, once the timerfd has
// said so, and sets it for the next.
func (k *clock) expire() {
	k.mu.Lock()
	now := k.now()
	due := k.due[:0]
	for len(k.heap) > 0 && k.heap[0].deadline <= now {
		c := k.heap[0]
		k.remove(0)
		c.popped = true
		due = append(due, c)
	}
	k.set = 0
	if len(k.heap) > 0 && !k.closed {
		k.setLocked(k.heap[0].deadline, now)
	}
	k.mu.Unlock()
	for i, c := range due {
		c.fire()
		due[i] = nil
	}
	k.mu.Lock()
	k.due = due[:0]
	k.mu.Unlock()
}

// close stops the clock: calls still waiting on it are not hedged.
func (k *clock) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	for _, c := range k.heap {
		c.slot = -1
	}
	k.heap = nil
	return k.file.Close()
}

// The heap, by deadline; each call knows its slot.

func (k *clock) push(c *call) {
	c.slot = len(k.heap)
	k.heap = append(k.heap, c)
	k.up(c.slot)
}

func (k *clock) remove(i int) {
	last := len(k.heap) - 1
	k.heap[i].slot = -1
	if i != last {
		k.heap[i] = k.heap[last]
		k.heap[i].slot = i
	}
	k.heap[last] = nil
	k.heap = k.heap[:last]
	if i != last {
		k.down(i)
		k.up(i)
	}
}

func (k *clock) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if k.heap[p].deadline <= k.heap[i].deadline {
			return
		}
		k.swap(i, p)
		i = p
	}
}

func (k *clock) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(k.heap) {
			return
		}
		m := l
		if r := l + 1; r < len(k.heap) && k.heap[r].deadline < k.heap[l].deadline {
			m = r
		}
		if k.heap[i].deadline <= k.heap[m].deadline {
			return
		}
		k.swap(i, m)
		i = m
	}
}

func (k *clock) swap(i, j int) {
	k.heap[i], k.heap[j] = k.heap[j], k.heap[i]
	k.heap[i].slot, k.heap[j].slot = i, j
}
