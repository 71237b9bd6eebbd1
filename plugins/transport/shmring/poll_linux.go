package shmring

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Polling. A side waiting for its peer first polls the ring, yielding its
// core between polls to any thread queued for it: on two cores that is
// often the peer it waits for.
//
// A polling goroutine holds a P, and the Go scheduler cannot tell it from
// one doing work. While every P of the process polls, the process's other
// goroutines wait for a P until a poll ends, up to spin later: a handler
// the engine serves off the reader, a caller just handed its answer. So
// a poller that finds every P polling lets them run first (64 KiB echo
// calls, 4 callers, on two cores: 31.8k-31.9k calls/s against
// 26.6k-27.2k, the server's CPU a call 28.6 µs against 35.6). When more
// goroutines poll than there are Ps, some of them wait for a P already,
// and handing ours over would only pass the polling around: the server of
// eight single-caller clients did half the calls/s when pollers did so.

// spinCheck is how many polls pass between clock reads while spinning.
const spinCheck = 64

// polling counts this process's goroutines in poll past their first
// yield.
var polling atomic.Int32

// poll calls done until it reports true or budget has passed since start,
// and reports whether done did. A budget of 0 polls not at all.
func poll(budget time.Duration, start time.Time, done func() bool) bool {
	if budget <= 0 {
		return false
	}
	// A poller counts itself, and reads GOMAXPROCS (which takes the
	// scheduler's lock), at its first yield: most waits end sooner, and
	// then touch no cache line other connections' readers write.
	var procs int32
	defer func() {
		if procs != 0 {
			polling.Add(-1)
		}
	}()
	for i := 1; ; i++ {
		if done() {
			return true
		}
		if i%spinCheck == 0 {
			if time.Since(start) >= budget {
				return false
			}
			if procs == 0 {
				procs = int32(runtime.GOMAXPROCS(0))
				polling.Add(1)
			}
			if polling.Load() == procs {
				runtime.Gosched()
			}
			yield()
		}
	}
}

// yield lets another thread that waits for this core run: while one side
// polls, the peer it waits for may be queued behind it on the same core.
func yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
