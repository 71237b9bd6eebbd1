package breaker

import (
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// State is a ratio breaker's state.
type State uint8

const (
	Closed   State = 0 // calls pass and are counted
	Open     State = 1 // calls are refused until the open duration passes
	HalfOpen State = 2 // a bounded number of probe calls pass
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// outcome is what an admitted call says of its instance.
type outcome uint8

const (
	succeeded outcome = iota
	failed
	ignored // nothing was learnt: the caller gave up, or another filter refused
)

// ticket is what allow hands an admitted call, for record.
type ticket struct {
	gen   uint64 // the state generation the call was admitted in
	probe bool   // a half-open probe
	at    int64  // a throttle's: when the call was admitted, which is when it counts
}

// circuit is the state of one breaker (one key). allow decides whether a
// call may go; record tells it how an admitted call went. Both take the
// clock rather than the time, so that a path that needs no time reads no
// clock.
type circuit interface {
	allow(now func() int64) (ticket, error)
	record(now func() int64, t ticket, o outcome)
	// state is the breaker's state, for tests and inspection: a throttle
	// (mode sre) is always Closed.
	state() State
	// figures are what the circuit reports of itself (state.go).
	figures(now func() int64) figures
}

// refusal is the error an open breaker refuses an instance with: the
// client then picks another one.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return kernel.ErrInstanceRefused }

// describe names what a circuit covers, e.g. "Echo.Who on 10.0.0.7:7000".
func describe(k key) string {
	switch {
	case k.method != "" && k.host != "":
		return k.method + " on " + k.host
	case k.host != "":
		return k.host
	case k.method != "":
		return k.method
	}
	return "every call"
}

// rejection builds the error a circuit for k fails a call with: a refusal
// of the instance when the circuit is the instance's, else Unavailable.
func rejection(k key, msg string) error {
	if k.host != "" {
		return &refusal{msg: msg}
	}
	return &kernel.Status{Code: kernel.Unavailable, Message: msg}
}

// ratioCircuit is the classic breaker: closed, open after too many
// failures, half-open after a while to probe.
type ratioCircuit struct {
	cfg   *config
	key   key
	log   *slog.Logger
	share *sharing // nil unless share: registry; it publishes openings and closings
	// sg packs the generation (bumped on every transition) and the state:
	// gen<<2 | state, so that a closed breaker admits with one load.
	sg atomic.Uint64

	mu        sync.Mutex
	win       window
	openUntil int64 // open: when probes may start
	probes    int   // half-open: probes admitted and not yet recorded
	successes int   // half-open: probes that succeeded
	openErr   error // the rejection while open, built when it opened
	busyErr   error // the rejection while half-open with every probe out

	// Counted where they happen, off the closed path, for ReportState.
	rejected   atomic.Uint64 // calls refused while open or half-open
	opened     atomic.Uint64 // transitions to Open
	peerOpened atomic.Uint64 // of which another client's opening caused (share.go)
}

func newRatioCircuit(cfg *config, k key, log *slog.Logger, share *sharing) *ratioCircuit {
	return &ratioCircuit{cfg: cfg, key: k, log: log, share: share, win: newWindow(cfg)}
}

func (c *ratioCircuit) state() State { return State(c.sg.Load() & 3) }

func (c *ratioCircuit) allow(now func() int64) (ticket, error) {
	sg := c.sg.Load()
	if State(sg&3) == Closed {
		return ticket{gen: sg >> 2}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sg = c.sg.Load()
	switch State(sg & 3) {
	case Closed:
		return ticket{gen: sg >> 2}, nil
	case Open:
		if now() < c.openUntil {
			c.rejected.Add(1)
			return ticket{}, c.openErr
		}
		c.set(HalfOpen)
		c.probes, c.successes = 0, 0
		c.log.Info("breaker: half-open, probing", "circuit", describe(c.key), "probes", c.cfg.probes)
	}
	if c.probes >= c.cfg.probes {
		if c.busyErr == nil {
			c.busyErr = rejection(c.key, "breaker: circuit for "+describe(c.key)+" is half-open and its "+
				strconv.Itoa(c.cfg.probes)+" probe calls are in flight")
		}
		c.rejected.Add(1)
		return ticket{}, c.busyErr
	}
	c.probes++
	return ticket{gen: c.sg.Load() >> 2, probe: true}, nil
}

func (c *ratioCircuit) record(now func() int64, t ticket, o outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sg := c.sg.Load()
	if sg>>2 != t.gen {
		return // admitted before the last transition: its outcome is stale
	}
	switch State(sg & 3) {
	case Closed:
		if o == ignored {
			return
		}
		var at int64
		if c.win.timed() {
			at = now()
		}
		c.win.add(at, o == failed)
		if total, failures := c.win.sums(at); total >= c.cfg.min && float64(failures) >= c.cfg.ratio*float64(total) {
			if at == 0 {
				at = now()
			}
			c.trip(at, "breaker: circuit for "+describe(c.key)+" is open: "+strconv.Itoa(failures)+" of "+strconv.Itoa(total)+
				" calls "+c.cfg.windowName()+" failed ("+c.cfg.codeNames+" count as failures); it lets "+
				strconv.Itoa(c.cfg.probes)+" probe calls through "+time.Duration(c.cfg.open).String()+" after it opened",
				failures, total, "failures", failures, "calls", total)
		}
	case HalfOpen:
		if !t.probe {
			return
		}
		switch o {
		case ignored:
			c.probes--
		case failed:
			c.trip(now(), "breaker: circuit for "+describe(c.key)+" is open: a probe call failed after it had opened ("+
				c.cfg.codeNames+" count as failures); it lets "+strconv.Itoa(c.cfg.probes)+" probe calls through "+
				time.Duration(c.cfg.open).String()+" after it opened again", 0, 0, "probe_failed", true)
		case succeeded:
			if c.successes++; c.successes >= c.cfg.probes {
				c.set(Closed)
				c.win.reset()
				c.log.Info("breaker: closed", "circuit", describe(c.key), "probes", c.successes)
				c.share.closed(c.key)
			}
		}
	}
}

// trip opens the circuit at now, refusing with msg; failures of calls
// (0 of 0 for a failed probe) are what opened it, published with the
// opening when the state is shared.
func (c *ratioCircuit) trip(now int64, msg string, failures, calls int, attrs ...any) {
	c.set(Open)
	c.opened.Add(1)
	c.openUntil = now + c.cfg.open
	c.openErr = rejection(c.key, msg)
	c.win.reset()
	c.log.Warn("breaker: opened", append([]any{"circuit", describe(c.key), "open_for", time.Duration(c.cfg.open)}, attrs...)...)
	c.share.opened(c.key, now, c.openUntil, failures, calls)
}

// set moves to s, starting a new generation. Called with mu held.
func (c *ratioCircuit) set(s State) {
	gen := c.sg.Load()>>2 + 1
	c.sg.Store(gen<<2 | uint64(s))
}

// throttle is Google SRE's client-side adaptive throttling: each request
// is rejected locally with probability
// max(0, (requests − K·accepts) / (requests + 1)) over the window, where
// requests counts every request the client meant to send (those it
// rejected too) and accepts those the backend accepted.
type throttle struct {
	cfg  *config
	key  key
	rand func() float64

	mu        sync.Mutex
	win       window // marked: accepted
	rejectErr error  // built on the first local rejection
	rejected  atomic.Uint64
}

func newThrottle(cfg *config, k key, rand func() float64) *throttle {
	return &throttle{cfg: cfg, key: k, rand: rand, win: newWindow(cfg)}
}

func (c *throttle) state() State { return Closed }

// rejectProbability is max(0, (requests − K·accepts) / (requests + 1)).
func rejectProbability(requests, accepts int, k float64) float64 {
	p := (float64(requests) - k*float64(accepts)) / float64(requests+1)
	return max(0, p)
}

func (c *throttle) allow(now func() int64) (ticket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at int64
	if c.win.timed() {
		at = now()
	}
	requests, accepts := c.win.sums(at)
	if requests < c.cfg.min {
		return ticket{at: at}, nil
	}
	if p := rejectProbability(requests, accepts, c.cfg.k); p > 0 && c.rand() < p {
		c.win.add(at, false) // a request rejected locally counts as a request not accepted
		c.rejected.Add(1)
		if c.rejectErr == nil {
			c.rejectErr = rejection(c.key, "breaker: adaptive throttling (mode sre) rejected a call to "+describe(c.key)+
				" locally: the backend accepted too few of the requests "+c.cfg.windowName()+" (rejecting with probability "+
				"max(0, (requests - "+strconv.FormatFloat(c.cfg.k, 'g', -1, 64)+"·accepts) / (requests + 1)))")
		}
		return ticket{}, c.rejectErr
	}
	return ticket{at: at}, nil
}

// record counts the call at the time it was admitted: requests are
// counted as they are sent, and a clock read is saved.
func (c *throttle) record(_ func() int64, t ticket, o outcome) {
	if o == ignored {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.win.add(t.at, o == succeeded)
}
