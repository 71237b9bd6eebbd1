package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/kernrpc/kernrpc/kernel"
)

// Notify returns service's instances, as Resolve lists them, and calls fn
// with the full set after every change until stop or Close
// (kernel.Notifier). No goroutine waits between changes: a change starts
// one, which runs fn for as long as sets keep coming faster than fn
// returns.
func (r *Registry) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("memory: notify %s: %w", service, err)
	}
	w := &watcher{service: service, static: r.static[service], notify: &notifier{fn: fn}}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, fmt.Errorf("memory: notify %s: %w", service, kernel.ErrClosed)
	}
	current := r.store.watch(w)
	r.watches[w] = nil
	return current, func() { r.endWatch(w) }, nil
}

// notifier hands a Notify's fn the sets the store gives it, one call at a
// time, the latest set only when fn falls behind.
type notifier struct {
	fn func([]kernel.Instance)

	mu      sync.Mutex
	next    []kernel.Instance
	pending bool // next is waiting for fn
	running bool // a goroutine is in run
	stopped bool
	// runs counts run goroutines, for stop to wait on. It is only added
	// to under mu before stopped is set, so no Add races stop's Wait.
	runs sync.WaitGroup
}

// hand gives fn set, starting a goroutine for it unless one runs.
func (n *notifier) hand(set []kernel.Instance) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	n.next, n.pending = set, true
	if !n.running {
		n.running = true
		n.runs.Add(1)
		go n.run()
	}
}

// run calls fn until no set is pending.
func (n *notifier) run() {
	defer n.runs.Done()
	for {
		n.mu.Lock()
		if !n.pending || n.stopped {
			n.running = false
			n.mu.Unlock()
			return
		}
		set := n.next
		n.next, n.pending = nil, false
		n.mu.Unlock()
		n.fn(set)
	}
}

// stop ends the deliveries and waits for the one in progress, if any.
func (n *notifier) stop() {
	n.mu.Lock()
	n.stopped = true
	n.next, n.pending = nil, false
	n.mu.Unlock()
	n.runs.Wait()
}
