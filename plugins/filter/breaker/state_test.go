package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// rig is a filter with a clock and a random source the test moves.
type rig struct {
	t     *testing.T
	f     *Filter
	clock time.Duration
	draw  float64 // what rand returns
	calls int     // calls that reached next
}

func newRig(t *testing.T, opts map[string]any) *rig {
	t.Helper()
	flt, err := Factory.Build(opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, f: flt.(*Filter), draw: 0.5}
	r.f.now = func() int64 { return int64(r.clock) }
	r.f.rand = func() float64 { return r.draw }
	r.f.log = slog.New(slog.DiscardHandler)
	return r
}

var (
	errUnavailable = kernel.Errorf(kernel.Unavailable, "down")
	errInvalid     = kernel.Errorf(kernel.InvalidArgument, "bad request")
)

// call makes one attempt on host that next answers with err (nil: a
// success), and returns what the filter returned.
func (r *rig) call(host string, err error) error {
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Peer: host, Instance: &kernel.Instance{Address: host}}
	_, got := r.f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
		r.calls++
		if err != nil {
			return nil, err
		}
		return "ok", nil
	})
	return got
}

func (r *rig) state(host string) State { return r.f.State("Echo.Who", host) }

func (r *rig) wantState(host string, want State, when string) {
	r.t.Helper()
	if got := r.state(host); got != want {
		r.t.Fatalf("%s: breaker for %s is %s, want %s", when, host, got, want)
	}
}

// refused reports whether err is the breaker refusing the instance.
func refused(err error) bool { return errors.Is(err, kernel.ErrInstanceRefused) }

const hostA, hostB = "10.0.0.1:7000", "10.0.0.2:7000"

var small = map[string]any{"min_requests": 4, "failure_ratio": 0.5, "open_duration": "5s", "half_open_probes": 2}

func TestClosedOpensAtTheRatioOnceTheWindowHoldsMinRequests(t *testing.T) {
	r := newRig(t, small)
	for i, err := range []error{errUnavailable, errUnavailable, errUnavailable} {
		if got := r.call(hostA, err); got != err {
			t.Fatalf("call %d: %v, want next's error", i, got)
		}
	}
	r.wantState(hostA, Closed, "3 failures, below min_requests 4")
	r.call(hostA, nil)
	r.wantState(hostA, Open, "3 failures of 4 calls")
	r.wantState(hostB, Closed, "another host")

	before := r.calls
	err := r.call(hostA, nil)
	if !refused(err) || r.calls != before {
		t.Fatalf("open breaker: %v, next called %d times; want a refusal wrapping ErrInstanceRefused and no call", err, r.calls-before)
	}
	for _, want := range []string{"breaker:", "Echo.Who on " + hostA, "is open", "3 of 4 calls in the last 10s failed", "Unavailable, DeadlineExceeded, Internal"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := r.call(hostB, nil); err != nil {
		t.Errorf("another host's breaker: %v", err)
	}
}

func TestRatioBelowThresholdStaysClosed(t *testing.T) {
	r := newRig(t, small)
	for range 10 {
		r.call(hostA, nil)
		r.call(hostA, nil)
		r.call(hostA, errUnavailable) // one in three
	}
	r.wantState(hostA, Closed, "a third of the calls failed, ratio 0.5")
}

func TestCallersOwnErrorsNeverTrip(t *testing.T) {
	r := newRig(t, small)
	for range 50 {
		r.call(hostA, errInvalid)
		r.call(hostA, kernel.Errorf(kernel.NotFound, "no such thing"))
		r.call(hostA, kernel.Errorf(kernel.Canceled, "caller gave up"))
		r.call(hostA, fmt.Errorf("another filter: %w", kernel.ErrInstanceRefused))
	}
	r.wantState(hostA, Closed, "InvalidArgument, NotFound, Canceled and refusals only")
	// Canceled and refusals counted as nothing: three failures now reach
	// the ratio of the 100 successes plus three, which they would not had
	// those been counted as successes either; so check with the window.
	r2 := newRig(t, small)
	for range 10 {
		r2.call(hostA, kernel.Errorf(kernel.Canceled, "caller gave up"))
	}
	r2.call(hostA, errUnavailable)
	r2.call(hostA, errUnavailable)
	r2.call(hostA, nil)
	r2.wantState(hostA, Closed, "2 failures of 3 counted calls, below min_requests 4")
	r2.call(hostA, nil)
	r2.wantState(hostA, Open, "2 failures of 4 counted calls: the cancelled calls did not count")
}

func TestOpenThenHalfOpenProbesThenClosed(t *testing.T) {
	r := newRig(t, small)
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	r.wantState(hostA, Open, "4 failures")
	r.clock += 5*time.Second - 1
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("1ns before open_duration: %v, want a refusal", err)
	}
	r.clock++

	// Two probes at once, a third refused while they are out.
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	results := make(chan error, 2)
	for range 2 {
		go func() {
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Peer: hostA, Instance: &kernel.Instance{Address: hostA}}
			_, err := r.f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
				started <- struct{}{}
				<-release
				return "ok", nil
			})
			results <- err
		}()
	}
	<-started
	<-started
	r.wantState(hostA, HalfOpen, "open_duration passed")
	err := r.call(hostA, nil)
	if !refused(err) || !strings.Contains(err.Error(), "half-open and its 2 probe calls are in flight") {
		t.Fatalf("third call while 2 probes are out: %v, want a refusal saying the probes are in flight", err)
	}
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	r.wantState(hostA, Closed, "2 successful probes")
	// Closed with an empty window: three failures do not reopen it.
	for range 3 {
		r.call(hostA, errUnavailable)
	}
	r.wantState(hostA, Closed, "3 failures after closing, below min_requests")
}

func TestFailedProbeReopensForAnotherOpenDuration(t *testing.T) {
	r := newRig(t, small)
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	r.clock += 5 * time.Second
	r.call(hostA, nil) // probe 1 succeeds
	r.wantState(hostA, HalfOpen, "one successful probe of 2")
	r.call(hostA, errUnavailable) // probe 2 fails
	r.wantState(hostA, Open, "a failed probe")
	err := r.call(hostA, nil)
	if !refused(err) || !strings.Contains(err.Error(), "a probe call failed") {
		t.Fatalf("after a failed probe: %v, want a refusal saying a probe failed", err)
	}
	r.clock += 5*time.Second - 1
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("before the second open_duration ended: %v", err)
	}
	r.clock++
	r.call(hostA, nil)
	r.call(hostA, nil)
	r.wantState(hostA, Closed, "two successful probes")
}

func TestIgnoredOrPanickingProbeFreesItsPlace(t *testing.T) {
	r := newRig(t, map[string]any{"min_requests": 1, "half_open_probes": 1, "open_duration": "1s"})
	r.call(hostA, errUnavailable)
	r.clock += time.Second
	r.call(hostA, kernel.Errorf(kernel.Canceled, "gave up"))
	r.wantState(hostA, HalfOpen, "a cancelled probe")
	func() {
		defer func() { _ = recover() }()
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Peer: hostA, Instance: &kernel.Instance{Address: hostA}}
		r.f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { panic("boom") })
	}()
	r.wantState(hostA, HalfOpen, "a probe that panicked")
	if err := r.call(hostA, nil); err != nil {
		t.Fatalf("the probe's place should be free again: %v", err)
	}
	r.wantState(hostA, Closed, "one successful probe")
}

func TestOutcomesOfCallsAdmittedBeforeATransitionAreStale(t *testing.T) {
	r := newRig(t, map[string]any{"min_requests": 2, "half_open_probes": 1, "open_duration": "1s"})
	c := r.f.store.lookup(key{"Echo.Who", hostA})
	early, _ := c.allow(r.f.now) // admitted while closed, answers late
	r.call(hostA, errUnavailable)
	r.call(hostA, errUnavailable)
	r.wantState(hostA, Open, "2 failures")
	r.clock += time.Second
	probe, err := c.allow(r.f.now)
	if err != nil || !probe.probe {
		t.Fatalf("probe: %v, %+v", err, probe)
	}
	c.record(r.f.now, early, failed)
	r.wantState(hostA, HalfOpen, "a failure of a call admitted while closed")
	c.record(r.f.now, probe, succeeded)
	r.wantState(hostA, Closed, "the probe's success")
}

func TestTimeWindowForgetsOldCalls(t *testing.T) {
	r := newRig(t, map[string]any{"min_requests": 4, "window_duration": "10s", "window_buckets": 10})
	for range 3 {
		r.call(hostA, errUnavailable)
	}
	r.clock = 10 * time.Second // the three failures' bucket rolls out
	r.call(hostA, nil)
	r.wantState(hostA, Closed, "the failures of 10s ago forgotten, one success")
	r.clock = 19*time.Second + 900*time.Millisecond
	r.call(hostA, nil)
	r.call(hostA, nil)
	r.call(hostA, errUnavailable)
	r.wantState(hostA, Closed, "1 failure of 4")
	r.clock = 20 * time.Second // the success at 10s rolls out
	r.call(hostA, errUnavailable)
	r.wantState(hostA, Open, "2 failures of 4")
}

func TestCountWindowHoldsTheLastCalls(t *testing.T) {
	r := newRig(t, map[string]any{"window": "count", "window_size": 4, "min_requests": 4, "failure_ratio": 0.75})
	r.call(hostA, errUnavailable)
	r.call(hostA, errUnavailable)
	for range 10 {
		r.call(hostA, nil)
	}
	r.wantState(hostA, Closed, "the failures left the 4-call window")
	r.call(hostA, errUnavailable)
	r.call(hostA, errUnavailable)
	r.wantState(hostA, Closed, "2 of the last 4 failed")
	r.call(hostA, errUnavailable)
	r.wantState(hostA, Open, "3 of the last 4 failed")
	// A count window needs no clock on the way, only to time the opening.
	r.clock += 5 * time.Second
	r.call(hostA, nil)
	r.wantState(hostA, HalfOpen, "one probe of 3")
}

func TestScopes(t *testing.T) {
	for _, tc := range []struct {
		scope             string
		otherMethodShares bool
		otherHostShares   bool
	}{
		{ScopeMethodHost, false, false},
		{ScopeHost, true, false},
		{ScopeMethod, false, true},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			r := newRig(t, map[string]any{"scope": tc.scope, "min_requests": 1})
			r.call(hostA, errUnavailable)
			if got := r.f.State("Echo.Other", hostA) == Open; got != tc.otherMethodShares {
				t.Errorf("another method on the same host open: %v, want %v", got, tc.otherMethodShares)
			}
			if got := r.f.State("Echo.Who", hostB) == Open; got != tc.otherHostShares {
				t.Errorf("the same method on another host open: %v, want %v", got, tc.otherHostShares)
			}
			err := r.call(hostA, nil)
			if tc.scope == ScopeMethod {
				// Every instance is covered: fail the call, do not refuse
				// the instance to have another pick refused too.
				if refused(err) || kernel.CodeOf(err) != kernel.Unavailable || !strings.Contains(err.Error(), "circuit for Echo.Who is open") {
					t.Errorf("scope method: %v, want Unavailable naming the method's breaker, not a refusal", err)
				}
			} else if !refused(err) {
				t.Errorf("scope %s: %v, want a refusal of the instance", tc.scope, err)
			}
		})
	}
}

func TestRejectProbability(t *testing.T) {
	for _, tc := range []struct {
		requests, accepts int
		k, want           float64
	}{
		{100, 100, 2, 0},
		{100, 50, 2, 0},
		{100, 25, 2, 50.0 / 101},
		{100, 0, 2, 100.0 / 101},
		{100, 50, 1, 50.0 / 101},
		{0, 0, 2, 0},
	} {
		if got := rejectProbability(tc.requests, tc.accepts, tc.k); got != tc.want {
			t.Errorf("requests %d, accepts %d, k %v: %v, want %v", tc.requests, tc.accepts, tc.k, got, tc.want)
		}
	}
}

func TestSREThrottlesWithTheFormula(t *testing.T) {
	r := newRig(t, map[string]any{"mode": "sre", "min_requests": 10, "k": 2})
	// 10 requests, 2 accepted: p = (10 - 4) / 11.
	for i := range 10 {
		var err error
		if i >= 2 {
			err = errUnavailable
		}
		r.call(hostA, err)
	}
	p := 6.0 / 11
	r.draw = p // not below p: passes
	if err := r.call(hostA, errUnavailable); err != errUnavailable {
		t.Fatalf("draw %v at p %v: %v, want the call sent", r.draw, p, err)
	}
	// now 11 requests, 2 accepts: p = 7/12
	r.draw = 7.0/12 - 1e-9
	before := r.calls
	err := r.call(hostA, nil)
	if !refused(err) || r.calls != before || !strings.Contains(err.Error(), "adaptive throttling") || !strings.Contains(err.Error(), "Echo.Who on "+hostA) {
		t.Fatalf("draw below p: %v (next called %d times), want a local rejection naming the breaker", err, r.calls-before)
	}
	// The rejection counted as a request: 12 requests, 2 accepts.
	c := r.f.store.lookup(key{"Echo.Who", hostA}).(*throttle)
	if req, acc := c.win.sums(int64(r.clock)); req != 12 || acc != 2 {
		t.Errorf("window: %d requests, %d accepts; want 12, 2", req, acc)
	}
	// A healthy backend is never throttled.
	for range 100 {
		r.call(hostB, nil)
	}
	r.draw = 0
	if err := r.call(hostB, nil); err != nil {
		t.Errorf("a backend accepting everything: %v", err)
	}
	// The window rolls: after it, the failures are forgotten.
	r.clock += 10 * time.Second
	if err := r.call(hostA, nil); err != nil {
		t.Errorf("after the window: %v", err)
	}
}

func TestSREBelowMinRequestsNeverRejects(t *testing.T) {
	r := newRig(t, map[string]any{"mode": "sre", "min_requests": 5})
	r.draw = 0
	for i := range 5 {
		if err := r.call(hostA, errUnavailable); err != errUnavailable {
			t.Fatalf("call %d, window below min_requests: %v", i, err)
		}
	}
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("5 requests, none accepted, draw 0: %v, want a rejection", err)
	}
}

func TestServerSidePassesThrough(t *testing.T) {
	r := newRig(t, map[string]any{"min_requests": 1})
	for range 5 {
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: hostA}
		_, err := r.f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { return nil, errUnavailable })
		if err != errUnavailable {
			t.Fatalf("server side: %v", err)
		}
	}
	if r.calls != 0 || r.state(hostA) != Closed {
		t.Errorf("the server side counted calls")
	}
}

func TestStoreDropsIdleCircuits(t *testing.T) {
	r := newRig(t, nil)
	s := r.f.store.(*localStore)
	for i := range minSweep {
		r.call(fmt.Sprintf("10.0.1.%d:7000", i), nil)
	}
	r.call(hostA, nil) // sweeps: marks every circuit idle, keeps them all
	if n := s.size(); n != minSweep+1 {
		t.Fatalf("%d circuits after the first sweep, want %d", n, minSweep+1)
	}
	for i := range minSweep { // half of the instances stay
		if i%2 == 0 {
			r.call(fmt.Sprintf("10.0.1.%d:7000", i), nil)
		}
	}
	for i := range minSweep + 1 { // new ones arrive until the next sweep
		r.call(fmt.Sprintf("10.0.2.%d:7000", i), nil)
	}
	if n := s.size(); n >= 3*minSweep {
		t.Errorf("%d circuits: the idle ones were never dropped", n)
	}
	if r.state("10.0.1.0:7000") != Closed || s.size() == 0 {
		t.Error("lost a used circuit")
	}
}

func TestBadOptions(t *testing.T) {
	for want, opts := range map[string]map[string]any{
		`option "mode"`:                            {"mode": "hystrix"},
		`option "scope"`:                           {"scope": "cluster"},
		`option "window"`:                          {"window": "sliding"},
		`option "failure_ratio"`:                   {"failure_ratio": 0},
		`option "min_requests"`:                    {"window": "count", "window_size": 10, "min_requests": 20},
		`option "open_duration"`:                   {"open_duration": "0s"},
		`option "half_open_probes"`:                {"half_open_probes": 0},
		`option "k"`:                               {"k": 0.5},
		`option "window_buckets"`:                  {"window_buckets": 0},
		`option "window_duration"`:                 {"window_duration": "5ms"},
		`InvalidArgument is the caller's outcome`:  {"failure_codes": []any{"Unavailable", "InvalidArgument"}},
		`must name at least one status code`:       {"failure_codes": []any{}},
		`option "share": must be none or registry`: {"share": "etcd"},
		`option "share": registry shares the open state of a ratio breaker, and mode sre has none`: {"share": "registry", "mode": "sre"},
		`option "share_namespace": is empty`: {"share": "registry", "share_namespace": ""},
	} {
		_, err := Factory.Build(opts, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("options %v: %v, want an error saying %s", opts, err, want)
		}
	}
}

func TestTimeWindowRolls(t *testing.T) {
	cfg, err := DefaultOptions().config() // 10s in 10 buckets
	if err != nil {
		t.Fatal(err)
	}
	w := newWindow(cfg)
	sec := int64(time.Second)
	w.add(0, true)
	w.add(5*sec, false)
	w.add(9*sec, true)
	if n, m := w.sums(9 * sec); n != 3 || m != 2 {
		t.Fatalf("at 9s: %d, %d; want 3, 2", n, m)
	}
	if n, m := w.sums(10 * sec); n != 2 || m != 1 {
		t.Fatalf("at 10s (the 0s bucket rolled out): %d, %d; want 2, 1", n, m)
	}
	w.add(sec/2, true) // older than the window (1s to 10s) now: not counted
	if n, _ := w.sums(10 * sec); n != 2 {
		t.Fatalf("a call older than the window was counted: %d", n)
	}
	w.add(7*sec, true) // late, but inside the window
	if n, m := w.sums(15 * sec); n != 2 || m != 2 {
		t.Fatalf("at 15s: %d, %d; want 2, 2 (the 7s and 9s calls)", n, m)
	}
	if n, m := w.sums(60 * sec); n != 0 || m != 0 {
		t.Fatalf("after a long quiet: %d, %d; want an empty window", n, m)
	}
	w.add(61*sec, false)
	if n, m := w.sums(61 * sec); n != 1 || m != 0 {
		t.Fatalf("after the quiet: %d, %d; want 1, 0", n, m)
	}
}

// An error that is a nil *kernel.Status (a typed nil a later attempt
// filter returned), or a *kernel.Status claiming OK, reaches the caller as
// Unknown (kernel.CodeOf), and the breaker counts it so: it does not
// panic, and with Unknown among failure_codes it is a failure.
func TestNilOrOKStatusErrorCountsAsUnknown(t *testing.T) {
	var nilStatus *kernel.Status
	for name, odd := range map[string]error{"nil *Status": nilStatus, "Status claiming OK": &kernel.Status{Code: kernel.OK, Message: "fine?"}} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, map[string]any{"min_requests": 4, "failure_ratio": 0.5, "failure_codes": []any{"Unknown"}})
			for i := range 4 {
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("call %d: the filter panicked: %v", i, p)
						}
					}()
					if got := r.call(hostA, odd); got != odd {
						t.Fatalf("call %d: %v, want next's error as it was", i, got)
					}
				}()
			}
			r.wantState(hostA, Open, "4 calls that ended Unknown, with Unknown a failure code")
		})
	}
}
