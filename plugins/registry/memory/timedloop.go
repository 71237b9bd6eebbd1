package memory

import "time"

// timedLoop is a goroutine that runs a step, then sleeps until the step
// asks to run again, or until woken, or until stopped: the expiry reaper
// of each store.
type timedLoop struct {
	poke chan struct{} // run the step again now
	quit chan struct{}
	done chan struct{}
}

// startTimedLoop runs step at once and then again after the wait it
// returns; with ok false there is nothing to wait for, and the loop sleeps
// until woken.
func startTimedLoop(step func(now time.Time) (wait time.Duration, ok bool)) *timedLoop {
	l := &timedLoop{poke: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go l.run(step)
	return l
}

// wake makes the loop run its step again. It never blocks: one pending poke
// is enough, since the step that consumes it sees everything done before.
func (l *timedLoop) wake() {
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// stop ends the loop and waits for its goroutine.
func (l *timedLoop) stop() {
	close(l.quit)
	<-l.done
}

func (l *timedLoop) run(step func(time.Time) (time.Duration, bool)) {
	defer close(l.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, ok := step(time.Now())
		if !ok {
			wait = time.Hour // a poke comes before anything is due
		}
		timer.Reset(wait)
		select {
		case <-l.quit:
			return
		case <-l.poke:
		case <-timer.C:
		}
	}
}
