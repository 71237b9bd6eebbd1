package hedge

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The clock fires every call it armed, none it disarmed, and none once
// closed; its heap keeps them in deadline order whatever the order of
// arming and disarming.
func TestClockFiresWhatIsArmedAndNothingElse(t *testing.T) {
	k := newClock()
	if k == nil {
		t.Skip("no timerfd here: runtime timers time every hedge")
	}
	f := &Filter{clock: k, maxAttempts: 2}
	defer f.Close()
	const n = 200
	calls := make([]*call, n)
	for i := range calls {
		c := f.newCall()
		c.launched = f.maxAttempts // fire only marks it fired
		calls[i] = c
		c.mu.Lock()
		// The ones to disarm wait long enough to be disarmed first.
		d := time.Duration(500+rand.IntN(4500)) * time.Microsecond
		if i%2 == 0 {
			d = preciseBelow - time.Duration(1+rand.IntN(1000))*time.Microsecond
		}
		f.arm(c, d)
		if c.onClock != (d < preciseBelow) {
			t.Fatalf("a delay of %v went on the clock: %v; want only those under %v", d, c.onClock, preciseBelow)
		}
		c.mu.Unlock()
	}
	k.mu.Lock()
	for i := 1; i < len(k.heap); i++ {
		if k.heap[(i-1)/2].deadline > k.heap[i].deadline || k.heap[i].slot != i {
			t.Fatalf("heap out of order at %d", i)
		}
	}
	k.mu.Unlock()
	stopped := make([]bool, n)
	for i := 0; i < n; i += 2 {
		c := calls[i]
		c.mu.Lock()
		early := k.now() < c.deadline
		stopped[i] = f.disarm(c)
		if early && !stopped[i] {
			t.Errorf("call %d: disarm before its deadline reported it may fire", i)
		}
		c.mu.Unlock()
	}
	k.mu.Lock()
	for i := 1; i < len(k.heap); i++ {
		if k.heap[(i-1)/2].deadline > k.heap[i].deadline || k.heap[i].slot != i {
			t.Fatalf("heap out of order at %d", i)
		}
	}
	k.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for i := 1; i < n; i += 2 {
		c := calls[i]
		for {
			c.mu.Lock()
			fired := c.fired
			c.mu.Unlock()
			if fired {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d never fired", i)
			}
			time.Sleep(time.Millisecond)
		}
		c.mu.Lock()
		if f.disarm(c) {
			t.Errorf("call %d fired, but disarm reports it stopped", i)
		}
		c.mu.Unlock()
	}
	time.Sleep(2 * preciseBelow)
	for i := 0; i < n; i += 2 {
		calls[i].mu.Lock()
		fired := calls[i].fired
		calls[i].mu.Unlock()
		if stopped[i] && fired {
			t.Errorf("call %d fired after it was disarmed", i)
		}
	}

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	c := f.newCall()
	c.launched = f.maxAttempts
	c.mu.Lock()
	f.arm(c, time.Millisecond)
	onClock := c.onClock
	c.mu.Unlock()
	if onClock {
		t.Error("a closed clock took a call")
	}
	time.Sleep(20 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fired {
		t.Error("after Close the runtime timer did not fire the call")
	}
}

// The clock fires close to the deadline: within a few milliseconds even
// on a loaded machine, where runtime timers would add up to one each.
func TestClockFiresOnTime(t *testing.T) {
	k := newClock()
	if k == nil {
		t.Skip("no timerfd here")
	}
	f := &Filter{clock: k, maxAttempts: 2}
	defer f.Close()
	var late []time.Duration
	for range 50 {
		c := f.newCall()
		c.launched = f.maxAttempts
		c.mu.Lock()
		f.arm(c, 300*time.Microsecond)
		due := c.deadline
		c.mu.Unlock()
		for {
			c.mu.Lock()
			fired := c.fired
			c.mu.Unlock()
			if fired {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		late = append(late, time.Duration(k.now()-due))
	}
	// Polled with runtime sleeps, so these are upper bounds.
	for _, l := range late {
		if l < 0 {
			t.Fatalf("fired %v early", -l)
		}
	}
}
