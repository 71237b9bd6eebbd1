package kernrpc

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// BenchmarkGivenDeadline is the work a call does for a deadline the
// client gives it in place, as a call through tcp-lv does it: make the
// context, read its deadline for the wire, ask Err as the read starts,
// have it wake a caller that is not reading, end it. "chain" is the
// context any call through a filter gets, for comparison.
func BenchmarkGivenDeadline(b *testing.B) {
	cs := &callState{Context: context.Background()}
	b.Run("chain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cs.chain = nil
			ctx := cs.chainContext()
			_, _ = ctx.Deadline()
			_ = ctx.Err()
		}
	})
	b.Run("given", func(b *testing.B) {
		at := &attempt{wake: make(chan struct{}, 1)}
		b.ReportAllocs()
		for b.Loop() {
			ctx := cs.withDeadline(context.Background(), 10*time.Second, "timeout")
			if dl, ok := ctx.Deadline(); !ok || time.Until(dl) <= 0 {
				b.Fatal("no deadline")
			}
			_, _ = kernel.DeadlineOnly(ctx)
			_ = ctx.Err()
			_ = cs.dl.wakeAt(ctx, at)
			cs.dl.end(ctx, false)
			cs.chain = nil
		}
	})
}

// One callState serves call after call: a deadline ends its own call's
// context only, a timer left set for an earlier call's deadline ends
// nothing of a later one's (it sets itself again), and a channel handed
// out is closed when its call ends while one only the engine used is
// kept for the next call.
func TestGivenDeadlinesOfOneCallStateOneAfterAnother(t *testing.T) {
	cs := &callState{}
	first := cs.withDeadline(context.Background(), 30*time.Millisecond, "timeout")
	<-engineDone(first)
	if err := first.Err(); err != context.DeadlineExceeded {
		t.Fatalf("Err() once the deadline passed = %v", err)
	}
	cs.dl.end(first, false)
	if err := first.Err(); err != context.DeadlineExceeded {
		t.Errorf("Err() of a call its deadline ended = %v, want DeadlineExceeded", err)
	}

	// Answered before its 50ms deadline: the timer stays set for it.
	early := cs.withDeadline(context.Background(), 50*time.Millisecond, "timeout")
	kept := engineDone(early)
	cs.dl.end(early, false)
	if err := early.Err(); err != context.Canceled {
		t.Errorf("Err() of a call that returned = %v, want Canceled", err)
	}
	select {
	case <-early.Done():
	default:
		t.Error("the context of a call that returned is not done")
	}

	later := cs.withDeadline(context.Background(), time.Hour, "timeout")
	if ch := engineDone(later); ch != kept {
		t.Error("a channel only the engine waited on was not kept for the next call")
	}
	cs.dl.end(early, false) // a stale end: the live call is another's
	select {
	case <-engineDone(later):
		t.Fatal("a later call's context is done before its deadline")
	case <-time.After(80 * time.Millisecond): // past early's deadline: the timer fired and set itself again
	}
	if err := later.Err(); err != nil {
		t.Fatalf("a later call's Err() = %v before its deadline", err)
	}
	exposed := later.Done()
	cs.dl.end(later, false)
	select {
	case <-exposed:
	default:
		t.Error("a channel handed out was not closed as its call ended")
	}
	next := cs.withDeadline(context.Background(), time.Hour, "timeout")
	select {
	case <-engineDone(next):
		t.Error("the next call got a closed channel")
	default:
	}
	cs.dl.end(next, false)
}

// What a call's end wakes (a derived context's cancel, a waiter on Done)
// finds Err set: context.WithCancel panics on a parent whose AfterFunc
// runs while its Err is still nil, which the race detector's scheduling
// showed when the call was marked over only after waking them.
func TestGivenDeadlineEndWakesWithErrSet(t *testing.T) {
	cs := &callState{}
	for range 2000 {
		ctx := cs.withDeadline(context.Background(), time.Hour, "timeout")
		child, cancel := context.WithCancel(ctx)
		seen := make(chan error, 1)
		go func() {
			<-ctx.Done()
			seen <- ctx.Err()
		}()
		cs.dl.end(ctx, false)
		<-child.Done()
		if err := child.Err(); err != context.Canceled {
			t.Fatalf("derived context's Err() after its call ended = %v, want Canceled", err)
		}
		if err := <-seen; err == nil {
			t.Fatal("a waiter woken by the call's end read a nil Err")
		}
		cancel()
		cs.chain = nil
	}
}

// A caller that waits without reading under a deadline given in place is
// woken by the deadline's timer on its own channel (sleeper), and not by a
// later call's deadline; a second waiter under the same deadline waits on
// Done instead, and is ended too.
func TestGivenDeadlineWakesTheWaitingAttempt(t *testing.T) {
	cs := &callState{}
	// Read before the deadline is set: one read after it, on a loaded
	// machine, once came 1.5ms late and saw the waiters woken "early".
	start := time.Now()
	ctx := cs.withDeadline(context.Background(), 40*time.Millisecond, "timeout")
	first, second := &attempt{wake: make(chan struct{}, 1)}, &attempt{wake: make(chan struct{}, 1)}
	var w1, w2 sleeper
	results := make(chan bool, 2)
	go func() { results <- w1.sleep(ctx, first) }()
	go func() {
		for cs.dl.waiterIs(nil) { // let first register as the waiter
			time.Sleep(time.Millisecond)
		}
		results <- w2.sleep(ctx, second)
	}()
	for range 2 {
		select {
		case woken := <-results:
			if woken {
				t.Errorf("sleep = true at the deadline, want false (ctx done)")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter was not woken at its deadline")
		}
	}
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("woken after %v, before the 40ms deadline", el)
	}
	if !w1.wakes || w2.wakes {
		t.Errorf("first waited on its own channel: %v, second: %v; want true, false", w1.wakes, w2.wakes)
	}
	cs.dl.end(ctx, false)

	// An answer wakes the waiter as before; the deadline does not.
	later := cs.withDeadline(context.Background(), time.Hour, "timeout")
	var w sleeper
	go first.signal()
	if !w.sleep(later, first) {
		t.Error("sleep = false on an answer before the deadline")
	}
	cs.dl.end(later, false)
	if !cs.dl.waiterIs(nil) {
		t.Error("the waiter outlived its call")
	}
}

func (d *callDeadline) waiterIs(at *attempt) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiter == at
}

// The first request under a deadline given in place carries the timeout
// as given; a second attempt, one under a derived context, and a first
// one sent after something asked for the context's Done (and may have
// waited on it) carry what the clock says is left.
func TestGivenDeadlineSentAsGivenOnce(t *testing.T) {
	cs := &callState{}
	ctx := cs.withDeadline(context.Background(), 10*time.Second, "timeout")
	dl, _ := ctx.Deadline()
	if got := cs.sentTimeout(ctx, dl); got != 10*time.Second {
		t.Errorf("first request: %v, want the 10s given", got)
	}
	derived, cancel := context.WithCancel(ctx)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	if got := cs.sentTimeout(derived, dl); got >= 10*time.Second || got < 9*time.Second {
		t.Errorf("under a derived context: %v, want what is left of 10s", got)
	}
	if got := cs.sentTimeout(ctx, dl); got >= 10*time.Second-time.Millisecond {
		t.Errorf("second request: %v, want what is left of 10s, 2ms on", got)
	}
	cs.dl.end(ctx, false)

	ctx = cs.withDeadline(context.Background(), 10*time.Second, "timeout")
	dl, _ = ctx.Deadline()
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Millisecond): // a filter pausing the call
	}
	if got := cs.sentTimeout(ctx, dl); got >= 10*time.Second-time.Millisecond {
		t.Errorf("first request after a wait on Done: %v, want what is left of 10s, 2ms on", got)
	}
	cs.dl.end(ctx, false)
}
