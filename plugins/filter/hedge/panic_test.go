package hedge_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/hedge"
)

// invokeRecovering calls f.Invoke as a recover filter placed before the
// hedge would, and reports the panic that reached it.
func invokeRecovering(f *hedge.Filter, ctx context.Context, next kernel.Invoker) (panicked any) {
	defer func() { panicked = recover() }()
	call(f, ctx, next)
	return nil
}

// A first attempt that panics once a hedge is out (a client filter after
// the hedge, a codec, a balancer) must not leave that hedge running with
// the call's info and req after Invoke has returned: the kernel.Filter
// contract forbids keeping them, and the engine reuses both.
func TestPanicInFirstAttemptDoesNotLeaveTheHedgeRunning(t *testing.T) {
	f := build(t, func(o *hedge.Options) { o.Delay = kernel.Duration(time.Millisecond) })
	hedgeStarted := make(chan struct{})
	var n atomic.Int32
	var hedgeEnded atomic.Bool
	next := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		if n.Add(1) == 1 { // the first attempt: wait for the hedge, then panic
			<-hedgeStarted
			panic("boom in attempt 1")
		}
		close(hedgeStarted) // the hedge: runs until cancelled
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // a little work after the cancel, using info and req
		hedgeEnded.Store(true)
		return nil, kernel.StatusOf(ctx.Err())
	}
	p := invokeRecovering(f, context.Background(), next)
	if p == nil {
		t.Fatal("the panic of the first attempt did not reach the caller")
	}
	if !hedgeEnded.Load() {
		// Wait for it anyway, so that goleak does not report it.
		deadline := time.Now().Add(2 * time.Second)
		for !hedgeEnded.Load() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("Invoke returned (by panicking) while the hedge it started still ran with the call's info and req")
	}
}

// A hedged attempt runs on a goroutine of the filter's: a panic there
// (a later client filter, a codec, a balancer) must reach the caller, as
// it would without hedging, where a recover filter turns it into the
// call's error; it must not kill the process.
func TestPanicInHedgeDoesNotKillTheProcess(t *testing.T) {
	if os.Getenv("HEDGE_PANIC_CHILD") == "1" {
		f, err := hedge.New(func() *hedge.Options {
			o := hedge.DefaultOptions()
			o.Delay = kernel.Duration(time.Millisecond)
			return o
		}())
		if err != nil {
			t.Fatal(err)
		}
		defer f.(*hedge.Filter).Close()
		var n atomic.Int32
		next := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
			if n.Add(1) == 1 {
				<-ctx.Done() // the slow first attempt
				return nil, kernel.StatusOf(ctx.Err())
			}
			panic("boom in the hedge")
		}
		p := invokeRecovering(f.(*hedge.Filter), context.Background(), next)
		if p == nil {
			t.Fatal("the hedge's panic did not reach the caller")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPanicInHedgeDoesNotKillTheProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HEDGE_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child process died: %v\n%s", err, firstLines(string(out), 12))
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
