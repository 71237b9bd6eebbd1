package overload

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// In mode codel a call woken with a slot may still never reach Invoke:
// a later Admitter (auth, token-bucket) refuses it, or its request does
// not decode. The server then tells the method's CallObservers
// (handled false), and nothing else. The slot it was given is free: the
// next waiter must get it, not wait for its deadline on an idle server.
func TestCodelWaiterGetsTheSlotOfACallThatNeverRan(t *testing.T) {
	flt, err := Factory.Build(map[string]any{"mode": "codel", "initial_limit": 2, "min_limit": 2, "max_limit": 2}, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := flt.(*Filter)
	info := func() *kernel.CallInfo { return &kernel.CallInfo{Method: "M", Side: kernel.ServerSide} }
	// ended does what the server does for a call answered before Invoke.
	ended := func(ci *kernel.CallInfo, err error) {
		if o, ok := any(f).(kernel.CallObserver); ok {
			o.CallEnded(ci, err, false)
		}
	}
	ctx := context.Background()

	// A and Z are in flight, holding both slots; Z stays until the end.
	hold := func() (release, done chan struct{}) {
		if err := f.Admit(ctx, info()); err != nil {
			t.Fatal(err)
		}
		release, done = make(chan struct{}), make(chan struct{})
		started := make(chan struct{})
		go func() {
			defer close(done)
			f.Invoke(ctx, info(), nil, func(context.Context, *kernel.CallInfo, any) (any, error) { close(started); <-release; return "ok", nil })
		}()
		<-started
		return release, done
	}
	releaseA, doneA := hold()
	releaseZ, doneZ := hold()
	defer func() { close(releaseZ); <-doneZ }()
	// B, then C, wait.
	admittedB := make(chan error, 1)
	go func() { admittedB <- f.Admit(ctx, info()) }()
	waitQueued(t, f, 1)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	admittedC := make(chan error, 1)
	go func() { admittedC <- f.Admit(cctx, info()) }()
	waitQueued(t, f, 2)

	close(releaseA)
	<-doneA
	if err := <-admittedB; err != nil {
		t.Fatalf("B: %v", err)
	}
	// B is refused by a later Admitter: it never reaches Invoke.
	infoB := info()
	ended(infoB, kernel.Errorf(kernel.Unauthenticated, "a later admitter refused B"))

	// Without the hand-over C waits out its deadline.
	if err := <-admittedC; err != nil {
		t.Fatalf("C, waiting with one of two slots free: %v; want it admitted", err)
	}
}
