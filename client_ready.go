package kernrpc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Waiting for an instance to take a call (client.wait_for_ready). By
// default a call that its instance could not take (a refused dial, a
// server shutting down, a connection closing before the call left) is
// sent again at once, up to client.retries times, and then fails: that
// finds another instance when the balancer has one, and tells the caller
// at once when it has none. While a lone server at a fixed address
// restarts, every one of those tries lands in the gap. A call that waits
// for readiness instead tries again after a growing pause, until its
// deadline, as gRPC's WaitForReady does. A server's ResourceExhausted
// (overload) is not waited out: that is the retry filter's to decide.

// waitForReadyKey carries the WaitForReady call option in the call's
// context, which the attempt loop reads only once its retries are spent.
type waitForReadyKey struct{}

// The pauses between tries of a call that waits: growing from
// firstReadyPause by readyGrowth up to maxReadyPause, each spread by
// ±20% so that callers waiting for the same restart do not dial in step.
const (
	firstReadyPause = 20 * time.Millisecond
	maxReadyPause   = time.Second
	readyGrowth     = 1.6
)

// waitsForReady reports whether a call with ctx waits for an instance to
// take it: its WaitForReady option if given, else the config's.
func (c *Client) waitsForReady(ctx context.Context) bool {
	if wait, ok := ctx.Value(waitForReadyKey{}).(bool); ok {
		return wait
	}
	return c.cfg.Client.WaitForReady
}

// readyWait is one call's wait for an instance that could not take it.
type readyWait struct {
	pauses int
	// until bounds the wait of a call without a deadline (dial_timeout
	// from its first pause); zero while unset or when ctx has a deadline.
	until time.Time
	// report is the registry's next report as of the last try's pick,
	// taken before it while the call's retries are spent: a report that
	// came during the try ends the pause at once (nil: as of the pause).
	report <-chan struct{}
}

// beforePick notes, for a try whose failure would be waited out, which
// report is next, before the pick: the report the try may miss.
func (w *readyWait) beforePick(c *Client) { w.report = *c.updated.Load() }

// readyPause is the pause before try n+1 of a call that waits.
func readyPause(n int) time.Duration {
	d := float64(firstReadyPause)
	for range n {
		if d *= readyGrowth; d >= float64(maxReadyPause) {
			d = float64(maxReadyPause)
			break
		}
	}
	return time.Duration(d * (0.8 + 0.4*rand.Float64()))
}

// awaitReady decides, for a call whose retries are spent and whose last
// attempt, to addr, failed with err: a call that waits for readiness,
// whose attempt the instance could not take (Unavailable, and not
// processed), pauses until its next try is due or the registry reports,
// and gets nil to pick again. It gets err otherwise, or the status to end
// with when its context ends first, the client closes, or a call without
// a deadline has waited dial_timeout.
func (c *Client) awaitReady(ctx context.Context, cs *callState, w *readyWait, addr string, err error) error {
	last := kernel.StatusOf(err)
	if last.Code != kernel.Unavailable || !last.Retryable || !c.waitsForReady(ctx) {
		return err
	}
	if w.pauses == 0 {
		c.log.get().Debug("waiting for an instance to take the call (wait_for_ready)", "instance", addr, "err", err)
	}
	pause := readyPause(w.pauses)
	w.pauses++
	if _, ok := ctx.Deadline(); !ok {
		if w.until.IsZero() {
			w.until = time.Now().Add(c.dialTimeout)
		}
		left := time.Until(w.until)
		if left <= 0 {
			return &kernel.Status{Code: kernel.Unavailable, Retryable: true, Message: fmt.Sprintf(
				"%s; waited client.dial_timeout (%s) for the instance to take the call (wait_for_ready), the most a call without a deadline waits",
				last.Message, c.cfg.Client.DialTimeout)}
		}
		pause = min(pause, left) // then try once more, at the bound
	}
	report := w.report
	if report == nil {
		report = *c.updated.Load()
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-report:
		return nil // an instance may have come or gone: pick again now
	case <-engineDone(ctx):
		return c.ctxStatus(ctx, cs, "waiting for "+addr+" to take the call (wait_for_ready); the last try: "+last.Message)
	case <-c.life.Done():
		return c.closedStatus()
	}
}
