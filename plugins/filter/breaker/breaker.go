// Package breaker is a client filter that stops sending calls to an
// instance that keeps failing them, so that they go to the healthy ones.
// It runs in the attempt stage, after the pick, once per attempt: it
// implements kernel.StagedFilter, so a config need not say so.
//
// Config name: "breaker". Options, with defaults:
//
//	filters:
//	  - name: breaker
//	    side: client
//	    options:
//	      mode: ratio           # ratio (circuit breaker) or sre (adaptive throttling)
//	      scope: method-host    # one breaker per method on each instance; or host, or method
//	      window: time          # time: the calls of the last window_duration; count: the last window_size calls
//	      window_duration: 10s  # time window: its span...
//	      window_buckets: 10    # ...counted in this many buckets (it rolls by 1s)
//	      window_size: 100      # count window: how many calls it holds
//	      failure_ratio: 0.5    # ratio: the share of failures in the window that opens a closed breaker
//	      min_requests: 20      # calls the window must hold before the breaker judges (both modes)
//	      open_duration: 5s     # ratio: how long an open breaker refuses before it probes
//	      half_open_probes: 3   # ratio: probes let through at once; as many successes close it
//	      failure_codes: [Unavailable, DeadlineExceeded, Internal] # codes that count as failures
//	      k: 2                  # sre: the multiplier K below
//	      share: none           # none: each client's own state; registry: openings shared through the client's registry
//	      share_namespace: default # share registry: clients of one namespace share; keys are breaker/<share_namespace>/...
//
// # Mode ratio
//
// A breaker is closed: calls pass, and each outcome is counted in the
// rolling window. Once the window holds min_requests calls of which at
// least failure_ratio failed, it opens: for open_duration every call is
// refused. Then it is half-open: half_open_probes calls pass at once,
// the others are refused; one failed probe opens it again, as many
// successful probes close it with an empty window.
//
// # Mode sre
//
// Client-side adaptive throttling, as in Google's SRE book ("Handling
// Overload"): with requests the calls the client meant to send in the
// window and accepts those the backend accepted (did not fail with a
// failure code), each call is rejected locally with probability
//
//	max(0, (requests − k·accepts) / (requests + 1))
//
// and a rejected call counts as a request not accepted. A healthy backend
// gets every call; one that accepts half of them gets about 1/k as many
// calls as it accepts, plus the few that notice its recovery. The open,
// half-open and ratio options do not apply.
//
// # What counts as a failure
//
// A call that ends with one of failure_codes counts as a failure of the
// instance, its code read as the caller gets it (kernel.CodeOf: an error
// that is a nil *kernel.Status, or one claiming OK, is Unknown). Any
// other code counts as a success: the instance answered, and a caller's
// own InvalidArgument (or NotFound, PermissionDenied...)
// never trips a breaker; OK, InvalidArgument and Canceled cannot be listed.
// Canceled counts as nothing (the caller gave up, or a hedge cancelled its
// slower attempt), and neither does a refusal by a later attempt filter.
// DeadlineExceeded counts, even when the caller's own deadline was short:
// take it out of failure_codes if callers set deadlines tighter than the
// instances can keep.
//
// # Refusals
//
// An open breaker of one instance (scope method-host or host) refuses the
// picked instance: its error wraps kernel.ErrInstanceRefused, names the
// breaker, the method and the address, and says why, and the client picks
// another instance. When every instance is refused, the client fails the
// call at once with Unavailable, quoting the last refusal:
//
//	kernrpc: Unavailable: no instance of "echo" took Echo.Who: attempt filters refused 8 picks
//	(last: breaker: circuit for Echo.Who on 10.0.0.7:7000 is open: 12 of 20 calls in the last 10s failed ...)
//
// With scope method, a breaker covers every instance, so an open one fails
// the call at once with Unavailable naming the breaker and the method.
// Breakers are created on first use and dropped once idle (their instance
// left); transitions are logged through Options.Logger (slog.Default()).
//
// # Readings
//
// The filter is a kernel.StateReporter (state.go): an exporter such as
// the prometheus filter reads, for every breaker it holds, labelled with
// the breaker's key (method, host; the part the scope leaves out is
// empty, the method is kernrpc's full name, "Echo.Who"):
//
//	breaker_state{method,host,state}     gauge, mode ratio: 1 for the state it is in (closed, open, half-open), 0 for the others
//	breaker_opened_total{method,host}    counter, mode ratio: times it opened
//	breaker_reject_probability{method,host} gauge, mode sre: the probability a call is rejected now
//	breaker_rejected_total{method,host}  counter: attempts it refused (open, half-open with every probe out, throttled)
//	breaker_peer_opened_total{method,host} counter, share registry: of the openings, those another client's caused
//	breaker_share_dropped_total{}        counter, share registry: openings and closings not published (queue full)
//	breaker_share_failed_total{}         counter, share registry: publications the registry refused
//
// A breaker stays open after open_duration until the next call makes it
// half-open. Counts are kept where the event happens, off the closed
// path; a breaker dropped as idle takes its counts with it (a counter
// reset, which rate() handles).
//
// # Where the state lives
//
// With share: none (the default) each client judges instances by its own
// calls: the state is in this process, behind a small internal interface
// (store, in store.go).
//
// With share: registry (mode ratio only: an sre throttle has no open
// state to share, and the option is refused with mode sre), every client
// of a share_namespace sees one open state per key, through the client's
// registry (kernel.SharedStore: the memory registry within a process, the
// etcd and consul registries across processes). When a client's breaker
// opens, its filter publishes the key
// breaker/<share_namespace>/<method>|<host> (the scope's key, each part
// path-escaped; the part the scope leaves out is empty) holding the
// wall-clock time until which it is open and the failures that opened it,
// for open_duration + 1s. Every client following
// the namespace opens its own breaker for that key until that time (but
// for no longer than its own open_duration + 1s: a peer whose clock runs
// ahead, or a corrupt entry, cannot shut an instance out for longer), logs
// "breaker: opened by another client" once, and counts it in
// breaker_opened_total and breaker_peer_opened_total; breaker_state says
// open, as for an opening of its own. Then it probes on its own: half-open
// stays local. A breaker that closes after its probes deletes the key; an
// opening that comes back through the watch from the client that
// published it, or whose time has passed, changes nothing, and so does
// one of another scope. Clients that share must agree on scope; their
// clocks are compared, so keep them in sync (NTP): a skew of s shortens or
// lengthens a peer's opening by s, up to that bound.
//
// Publishing is off the call path: a goroutine per filter writes what a
// bounded queue (64) holds, and an opening that finds the queue full is
// dropped and counted (breaker_share_dropped_total); a call never waits on
// the registry. The filter follows the shared state from the time the
// client is built (kernel.PluginsObserver; an opening already published
// is applied before the first call) until it is closed. A registry that
// cannot share (one of a user's own) fails no call: the filter logs an
// error, once, naming the registry, and keeps its state to itself; so does
// one whose watch fails, until a retry succeeds.
//
// It works on the client side only (a breaker judges instances, which only
// a client picks) and says so (kernel.SidedFilter): an entry with no side
// leaves servers without it, and one with side: server is a config error.
// Called on the server side all the same, it passes every call through.
package breaker

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "breaker"

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "client: stops calls to instances that keep failing (circuit breaker or SRE adaptive throttling)", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	cfg, err := o.config()
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	f := &Filter{cfg: cfg, log: log, rand: rand.Float64}
	base := time.Now()
	f.now = func() int64 { return int64(time.Since(base)) }
	f.wall = func() int64 { return time.Now().UnixNano() }
	if cfg.share {
		f.share = newSharing(f)
	}
	f.store = newLocalStore(f.newCircuit)
	return f, nil
}

// Filter is the breaker filter: one breaker per key its scope gives.
type Filter struct {
	cfg   *config
	log   *slog.Logger
	store store
	// now reads the clock (ns since the filter was built) and rand draws
	// in [0, 1): tests replace both before the first call. wall is the
	// wall clock in unix ns, for the times shared with other processes.
	now  func() int64
	rand func() float64
	wall func() int64
	// share links the filter to the state the clients of its
	// share_namespace share (share: registry); nil otherwise.
	share *sharing
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.StagedFilter = (*Filter)(nil)
	_ kernel.SidedFilter  = (*Filter)(nil)
)

// Stage puts the filter in the attempt stage, after the pick.
func (*Filter) Stage() kernel.Stage { return kernel.AttemptStage }

// Side keeps the filter to clients.
func (*Filter) Side() kernel.Side { return kernel.ClientSide }

func (f *Filter) newCircuit(k key) circuit {
	if f.cfg.sre {
		return newThrottle(f.cfg, k, func() float64 { return f.rand() })
	}
	return newRatioCircuit(f.cfg, k, f.log, f.share)
}

// State returns the state of the breaker for method on host (the address
// of an instance), as the scope keys it; a breaker not yet used is
// Closed. A throttle (mode sre) is always Closed.
func (f *Filter) State(method, host string) State {
	return f.store.lookup(f.key(method, host)).state()
}

func (f *Filter) key(method, host string) key {
	var k key
	if f.cfg.byMethod {
		k.method = method
	}
	if f.cfg.byHost {
		k.host = host
	}
	return k
}

// Invoke lets the attempt through if its breaker allows, and counts how it
// went.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side != kernel.ClientSide {
		return next(ctx, info, req)
	}
	host := info.Peer
	if info.Instance != nil {
		host = info.Instance.Address
	}
	c := f.store.lookup(f.key(info.Method, host))
	t, err := c.allow(f.now)
	if err != nil {
		return nil, err
	}
	recorded := false
	defer func() {
		if !recorded { // next panicked: free a probe's place
			c.record(f.now, t, ignored)
		}
	}()
	resp, err := next(ctx, info, req)
	recorded = true
	c.record(f.now, t, f.outcome(err))
	return resp, err
}

// outcome classifies an attempt's error.
func (f *Filter) outcome(err error) outcome {
	if err == nil {
		return succeeded
	}
	var code kernel.Code
	if st, ok := err.(*kernel.Status); ok && st != nil && st.Code != kernel.OK {
		code = st.Code
	} else {
		if !ok && errors.Is(err, kernel.ErrInstanceRefused) {
			return ignored
		}
		// As the caller gets it: a nil *Status, or one claiming OK, is
		// Unknown.
		code = kernel.CodeOf(err)
	}
	switch {
	case code == kernel.Canceled:
		return ignored
	case f.cfg.isFailure(code):
		return failed
	}
	return succeeded
}
