package overload_test

import (
	"context"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// answerClock is a server filter put before overload: it notes when a
// call comes up for admission (kernel.Admitter, admitting everything) and,
// told the call was answered (kernel.CallObserver), how long the server
// took to answer it, for the calls refused before Invoke and for those
// served. That is the server's own part, apart from the client's
// scheduling, which on a busy machine running 2400 client goroutines a
// second dominates what the client sees.
type answerClock struct {
	started sync.Map // *kernel.CallInfo -> time.Time
	mu      sync.Mutex
	refused []time.Duration
	served  []time.Duration
}

const answerClockName = "test-answer-clock"

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: answerClockName, New: func(any) (kernel.Filter, error) { return &answerClock{}, nil }})
}

var (
	_ kernel.Admitter     = (*answerClock)(nil)
	_ kernel.CallObserver = (*answerClock)(nil)
)

func (a *answerClock) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (a *answerClock) Admit(_ context.Context, info *kernel.CallInfo) error {
	a.started.Store(info, time.Now())
	return nil
}

func (a *answerClock) CallEnded(info *kernel.CallInfo, _ error, handled bool) {
	v, ok := a.started.LoadAndDelete(info)
	if !ok {
		return
	}
	took := time.Since(v.(time.Time))
	a.mu.Lock()
	if handled {
		a.served = append(a.served, took)
	} else {
		a.refused = append(a.refused, took)
	}
	a.mu.Unlock()
}

// take returns the refusals' and the served calls' times so far, once
// there are at least n refusals or after a second (CallEnded runs after
// the answer is written, so a client can have its answer first), and
// forgets them.
func (a *answerClock) take(n int) (refused, served []time.Duration) {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		a.mu.Lock()
		enough := len(a.refused) >= n
		a.mu.Unlock()
		if enough {
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	refused, served = a.refused, a.served
	a.refused, a.served = nil, nil
	return refused, served
}
