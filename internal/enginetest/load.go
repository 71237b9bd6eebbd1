package enginetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// Load is callers calling in a loop until Stop, counting what succeeded
// and what failed: the load a test keeps on a service while it restarts or
// shuts down its servers.
type Load struct {
	what       string // what a call is, for messages: "calls", "streams"
	ok, failed atomic.Int64
	mu         sync.Mutex
	first      []error // the first few failures
	stop       chan struct{}
	wg         sync.WaitGroup
}

// keptErrors is how many failures a Load keeps to report.
const keptErrors = 5

// StartLoad starts n callers; caller i calls call(i) until Stop, and a
// call succeeded when it returns nil. what names a call in messages.
func StartLoad(what string, n int, call func(caller int) error) *Load {
	l := &Load{what: what, stop: make(chan struct{})}
	for i := range n {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				if err := call(i); err != nil {
					l.fail(err)
				} else {
					l.ok.Add(1)
				}
			}
		})
	}
	return l
}

func (l *Load) fail(err error) {
	l.failed.Add(1)
	l.mu.Lock()
	if len(l.first) < keptErrors {
		l.first = append(l.first, err)
	}
	l.mu.Unlock()
}

// Stop stops the callers and waits for their last calls.
func (l *Load) Stop() {
	close(l.stop)
	l.wg.Wait()
}

// OK is how many calls succeeded so far.
func (l *Load) OK() int64 { return l.ok.Load() }

// Failed is how many calls failed so far.
func (l *Load) Failed() int64 { return l.failed.Load() }

// FirstErrors returns the first few failures.
func (l *Load) FirstErrors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.first...)
}

// Check, after Stop, fails t if any call failed, naming the first
// failures, or if fewer than least succeeded (the load did not run).
func (l *Load) Check(t testing.TB, least int64) {
	t.Helper()
	ok, failed := l.ok.Load(), l.failed.Load()
	if failed > 0 {
		t.Errorf("%d of %d %s failed; the first: %v", failed, ok+failed, l.what, l.first)
	}
	if ok < least {
		t.Errorf("only %d %s succeeded (want at least %d): the load did not run", ok, l.what, least)
	}
}

// String says how many calls succeeded, for a test's log.
func (l *Load) String() string { return fmt.Sprintf("%d %s", l.ok.Load(), l.what) }
