package kernrpc

import (
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Senders taking credit at once, lock-free, against a receiver granting
// it back: what is outstanding never exceeds what the rule allows, and no
// sender that waits misses the credit that would let it go (each waits
// on its channel with a timeout, which fails the test).
func TestSendWindowUnderConcurrentSendersAndGrants(t *testing.T) {
	const (
		window  = 1 << 12
		cost    = 100
		senders = 8
		each    = 2000
	)
	var w sendWindow
	w.announce(window)
	sent := make(chan int64, senders*each)
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				for {
					ok, wait := w.take(cost)
					if ok {
						break
					}
					select {
					case <-wait:
					case <-time.After(5 * time.Second):
						t.Error("a waiting sender was not woken by the credit granted back")
						return
					}
				}
				if used := w.used.Load(); used > window {
					t.Errorf("%d outstanding, more than the window %d", used, window)
				}
				sent <- cost
			}
		}()
	}
	granted := make(chan struct{})
	go func() { // the receiver: reads what was sent, grants it back in batches
		defer close(granted)
		var unread int64
		for range senders * each {
			unread += <-sent
			if unread > window/2 {
				w.announce(unread)
				unread = 0
			}
		}
		w.announce(unread)
	}()
	wg.Wait()
	<-granted
	if used := w.used.Load(); used != 0 {
		t.Errorf("after every message was granted back, %d is outstanding", used)
	}
}

// Grants go out below 2³¹ each (docs/protocol.md, the credit field), and
// add up to what was read: a message larger than the window (the window
// lets one go once half of it is free) can make what is due past that, or
// past what a uint32 holds.
func TestGrantsNearTheLargestWindow(t *testing.T) {
	const window = 1<<31 - 1
	var frames []*kernel.Frame
	write := func(f *kernel.Frame) error {
		frames = append(frames, f)
		return nil
	}
	fl := newConnFlow(window)
	costs := []int64{window / 2, 1<<32 - 1}
	var due int64
	for _, c := range costs {
		if !fl.accept(c) {
			t.Fatalf("a message of cost %d refused with %d outstanding of a %d window", c, fl.recv.outstanding, int64(window))
		}
		fl.consumed(c, write)
		due += c
	}
	var granted int64
	for _, f := range frames {
		if f.Credit >= 1<<31 {
			t.Errorf("a grant of %d: credit goes below 2^31", f.Credit)
		}
		granted += int64(f.Credit)
	}
	if granted != due {
		t.Fatalf("granted %d back in %d frames, after %d was read", granted, len(frames), due)
	}
}

// A grant the transport refuses alone (a *kernel.Status) is reported to
// the side, which closes the connection: the credit would never reach the
// peer otherwise. One that fails because the connection is dead is not:
// nothing waits for it.
func TestRefusedGrantIsReported(t *testing.T) {
	fl := newConnFlow(1 << 10)
	var reported []uint64
	fl.refused = func(id uint64, err error) { reported = append(reported, id) }
	refuse := func(*kernel.Frame) error {
		return kernel.RefusedFrame(kernel.ResourceExhausted, "test: no room", nil)
	}
	dead := func(*kernel.Frame) error { return kernel.ErrClosed }
	fl.writeGrant(refuse, 7, 600)
	fl.writeGrant(dead, 8, 600)
	if !fl.accept(600) {
		t.Fatal("600 of a 1024 window refused")
	}
	fl.consumed(600, refuse)
	if len(reported) != 2 || reported[0] != 7 || reported[1] != 0 {
		t.Fatalf("refusals reported for call ids %v; want [7 0] (the stream's, then the connection's)", reported)
	}
}
