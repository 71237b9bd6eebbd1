package plugintest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

const (
	// filterAdmitCalls is how many calls in a row the Admitter check makes
	// for each way a call ends: more than a concurrency limit is likely to
	// be (overload's max_limit defaults to 1000), so that a slot kept by
	// every such call shows as a refusal before the check ends.
	filterAdmitCalls = 1024
	// filterAdmitWait bounds each call's ctx in the Admitter check: a
	// filter that queues a call above its limit (overload in mode codel)
	// waits this long for a slot a leak never frees, then refuses it.
	filterAdmitWait = 2 * time.Second
	// filterObservedSize is the ResponseSize the suite's CallEnded gives
	// for an answer, as the server sets it once the answer is encoded.
	filterObservedSize = 64
)

// filterEnding is one way a server call the Admitters admitted ends, as
// the engine ends it (server_dispatch.go).
type filterEnding struct {
	name string // the subtest
	what string // "calls that ...", for messages
	fix  string // what to do, for messages
	// invoke is false for a call that ends before Invoke: the server then
	// calls CallEnded with handled false, and err, and never Invoke.
	invoke bool
	err    error
	// next is the handler for a call that goes through Invoke; cancel
	// cancels the call's ctx.
	next   func(cancel context.CancelFunc) kernel.Invoker
	panics bool // next panics
}

var (
	filterEndingSucceeded = filterEnding{
		name: "Succeeded", what: "succeeded", invoke: true,
		next: func(context.CancelFunc) kernel.Invoker { return freshNext("admitted") },
	}
	filterEndings = []filterEnding{
		{
			name: "BeforeInvoke", what: "were admitted but ended before Invoke, as a call does when a later Admitter " +
				"refuses it or its request does not decode (the server calls CallEnded with handled false, never Invoke)",
			fix: "Admit must not take anything that only Invoke gives back (kernel.Admitter): take the slot in Invoke, " +
				"or, in a kernel.CallObserver, give it back in CallEnded, which the server calls for every call, handled or not",
			err: kernel.Errorf(kernel.InvalidArgument, "plugintest: the request did not decode"),
		},
		{
			name: "Error", what: "went through Invoke to a handler that failed",
			fix:    "give back what Admit took in a defer in Invoke (or in CallEnded), not only when next succeeds",
			invoke: true,
			next: func(context.CancelFunc) kernel.Invoker {
				return func(context.Context, *kernel.CallInfo, any) (any, error) {
					return nil, &kernel.Status{Code: kernel.Unavailable, Message: "plugintest: the handler failed"}
				}
			},
		},
		{
			name: "Panic", what: "went through Invoke to a handler that panicked (the server recovers it beyond the filters)",
			fix: "give back what Admit took in a defer in Invoke (or in CallEnded, which the server calls with status Internal), " +
				"so that it is given back while the panic unwinds",
			invoke: true, panics: true,
			next: func(context.CancelFunc) kernel.Invoker {
				return func(context.Context, *kernel.CallInfo, any) (any, error) {
					panic("plugintest: the handler panicked")
				}
			},
		},
		{
			name: "Cancelled", what: "went through Invoke and were cancelled while the handler ran",
			fix:    "give back what Admit took in a defer in Invoke (or in CallEnded), also for a call whose ctx ended",
			invoke: true,
			next: func(cancel context.CancelFunc) kernel.Invoker {
				return func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
					cancel()
					select {
					case <-ctx.Done():
						return nil, kernel.StatusOf(ctx.Err())
					case <-time.After(filterCancelGrace):
						return nil, kernel.Errorf(kernel.Canceled, "plugintest: the call was cancelled")
					}
				}
			},
		},
	}
)

// filterAdmitter holds a kernel.Admitter to giving back what Admit takes
// whatever way an admitted call ends: before Invoke (a later Admitter
// refused it, its request did not decode), or in Invoke with the handler
// failing, panicking or cancelled. For each, on a fresh filter, the suite
// ends filterAdmitCalls calls that way, one after another, as the server
// would (Admit, then Invoke or not, then CallEnded for a
// kernel.CallObserver), and fails if Admit refuses one of them while a
// fresh filter admits twice as many calls that succeed: a slot kept by
// every call that ends that way. Refusing calls that succeed as well is
// a rate limit, which the check cannot tell from a leak, and skips.
func filterAdmitter(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	probe := build(t, f, cfg.Options)
	_, ok := probe.(kernel.Admitter)
	closePlugin(probe)
	switch {
	case !ok:
		t.Skipf("the filter does not implement kernel.Admitter")
	case !slices.Contains(filterSides(cfg), kernel.ServerSide):
		t.Skipf("the filter is checked on the %s side only, and only the server calls Admit", cfg.Side)
	case cfg.RejectsEveryCall:
		t.Skipf("FilterConfig.RejectsEveryCall is set: the filter admits no call, so none can keep what Admit took")
	}
	for _, end := range filterEndings {
		t.Run(end.name, func(t tb) { filterAdmitEnding(t, f, cfg, end) })
	}
}

func filterAdmitEnding(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig, end filterEnding) {
	t.Helper()
	e := newAdmitEnv(t, f, cfg)
	n, refusal, ok := e.admitRun(t, end, filterAdmitCalls)
	if !ok || refusal == nil {
		return
	}
	if n == 0 {
		e.rejectedPassing(t, refusal)
		return
	}
	ctl := newAdmitEnv(t, f, cfg)
	want := 2*n + 1
	m, ctlRefusal, ok := ctl.admitRun(t, filterEndingSucceeded, want)
	if !ok {
		return
	}
	if ctlRefusal != nil {
		t.Skipf("Admit refused call %d after %d calls that %s, but a fresh filter refuses call %d of calls that succeed too: "+
			"a rate limit (what time gives back, not a call's end), so the check cannot tell whether these calls gave back "+
			"what Admit took; configure FilterConfig.Options so that the suite's calls do not exhaust it, to have this checked",
			n+1, n, end.what, m+1)
	}
	t.Errorf("Admit admitted %d calls in a row that %s, then refused the next (%v), though a fresh filter admits %d calls "+
		"in a row that succeed: each call that ends this way keeps what Admit took (a slot, a count), until the filter "+
		"refuses every call; %s", n, end.what, refusal, want, end.fix)
}

// admitEnv is a fresh filter that the caller checked is an Admitter, on
// the server side.
type admitEnv struct {
	*filterEnv
	adm kernel.Admitter
	obs kernel.CallObserver // nil if the filter is none
}

func newAdmitEnv(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) admitEnv {
	t.Helper()
	flt := build(t, f, cfg.Options)
	t.Cleanup(func() { closePlugin(flt) })
	obs, _ := flt.(kernel.CallObserver)
	return admitEnv{
		filterEnv: &filterEnv{filter: flt, side: kernel.ServerSide, cfg: cfg},
		adm:       flt.(kernel.Admitter),
		obs:       obs,
	}
}

// admitRun makes up to calls calls that end as end says, one after
// another, and returns how many Admit admitted before it refused one (and
// with what); ok is false if t failed.
func (e admitEnv) admitRun(t tb, end filterEnding, calls int) (admitted int, refusal error, ok bool) {
	t.Helper()
	for i := range calls {
		refusal, ok := e.admitCall(t, end)
		if !ok || refusal != nil {
			return i, refusal, ok
		}
	}
	return calls, nil, true
}

// admitCall makes one call as the server does: Admit; then, if admitted,
// Invoke or not, as end says; then CallEnded.
func (e admitEnv) admitCall(t tb, end filterEnding) (refusal error, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), filterAdmitWait)
	defer cancel()
	info := e.info()
	err, ok := e.admit(t, ctx, info)
	if !ok {
		return nil, false
	}
	if err != nil {
		return err, e.callEnded(t, e.obs, info, err, false)
	}
	if !end.invoke {
		return nil, e.callEnded(t, e.obs, info, end.err, false)
	}
	o, finished := e.run(ctx, info, end.next(cancel))
	switch {
	case !finished:
		t.Errorf("Invoke on the server side, for a call Admit admitted, did not return within %s", e.patience())
		return nil, false
	case o.panicked && !end.panics:
		t.Errorf("Invoke on the server side, for a call Admit admitted, panicked: %v", o.err)
		return nil, false
	case o.panicked:
		o.err = kernel.Errorf(kernel.Internal, "handler for %s panicked: %v", info.Method, o.err)
	case o.err == nil:
		info.ResponseSize = filterObservedSize
	}
	return nil, e.callEnded(t, e.obs, info, o.err, true)
}

// admit calls Admit on a goroutine of its own, so that a filter that
// panics or hangs fails t instead of the test binary.
func (e admitEnv) admit(t tb, ctx context.Context, info *kernel.CallInfo) (err error, ok bool) {
	t.Helper()
	type result struct {
		err      error
		panicked any
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{panicked: p}
			}
		}()
		done <- result{err: e.adm.Admit(ctx, info)}
	}()
	select {
	case r := <-done:
		if r.panicked != nil {
			t.Errorf("Admit on the server side panicked: %v", r.panicked)
			return nil, false
		}
		return r.err, true
	case <-time.After(e.patience()):
		t.Errorf("Admit on the server side did not return within %s, though its ctx ends after %s; a call that waits for "+
			"capacity must stop waiting when its ctx ends", e.patience(), filterAdmitWait)
		return nil, false
	}
}

// callEnded tells obs, if it is not nil, that the call info ended with
// err, as the server does once the answer is sent, on a goroutine of its
// own so that an observer that panics or blocks fails t.
func (e *filterEnv) callEnded(t tb, obs kernel.CallObserver, info *kernel.CallInfo, err error, handled bool) bool {
	t.Helper()
	if obs == nil {
		return true
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		obs.CallEnded(info, err, handled)
	}()
	how := "a call that went through Invoke"
	if !handled {
		how = "a call answered before Invoke (refused by an Admitter, or whose request did not decode), which Invoke never saw"
	}
	select {
	case p := <-done:
		if p != nil {
			t.Errorf("CallEnded (handled %t, err %v) panicked for %s: %v; the server calls it for every call of the methods "+
				"the filter applies to, so it must not count on state that only Invoke sets up", handled, err, how, p)
			return false
		}
		return true
	case <-time.After(e.patience()):
		t.Errorf("CallEnded (handled %t, err %v) did not return within %s for %s; it runs on the call's goroutine, "+
			"so it must be quick and must not block (kernel.CallObserver), nor wait for anything only Invoke does",
			handled, err, e.patience(), how)
		return false
	}
}

// filterCallObserver holds a kernel.CallObserver to what the server asks of
// CallEnded: it is called once for every call, after Invoke for a call
// that went through it (handled) and for calls answered before it, which
// the filter's Invoke never saw (refused by an Admitter, whose request did
// not decode, refused as the server shuts down), and with a nil
// Metadata; from many calls' goroutines at once. For each, it must
// return without panicking or blocking.
func filterCallObserver(t tb, e *filterEnv) {
	obs, ok := e.filter.(kernel.CallObserver)
	switch {
	case !ok:
		t.Skipf("the filter does not implement kernel.CallObserver")
	case e.side != kernel.ServerSide:
		t.Skipf("only the server calls CallEnded")
	}
	unhandled := []error{
		kernel.Errorf(kernel.InvalidArgument, "plugintest: the request did not decode"),
		kernel.Errorf(kernel.ResourceExhausted, "plugintest: refused by an Admitter"),
		&kernel.Status{Code: kernel.Unavailable, Retryable: true, Message: "plugintest: the server is shutting down"},
	}
	for _, err := range unhandled {
		info := e.info()
		if !e.callEnded(t, obs, info, err, false) {
			return
		}
		info = e.info()
		info.Metadata = nil
		if !e.callEnded(t, obs, info, err, false) {
			return
		}
	}
	for _, end := range []filterEnding{filterEndingSucceeded, filterEndings[1]} {
		if !e.observedCall(t, obs, end) {
			return
		}
	}
	// Many calls at once, as many connections' calls end at once; run
	// with -race.
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 16 {
				var ok bool
				if (g+i)%2 == 0 {
					ok = e.callEnded(t, obs, e.info(), unhandled[i%len(unhandled)], false)
				} else {
					ok = e.observedCall(t, obs, filterEndingSucceeded)
				}
				if !ok {
					return
				}
			}
		})
	}
	wg.Wait()
}

// observedCall runs a call through Invoke to a handler that ends as end
// says, then tells obs it ended.
func (e *filterEnv) observedCall(t tb, obs kernel.CallObserver, end filterEnding) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	info := e.info()
	o, finished := e.run(ctx, info, end.next(cancel))
	switch {
	case !finished:
		t.Errorf("Invoke on the %s side did not return within %s", e.side, e.patience())
		return false
	case o.panicked:
		t.Errorf("Invoke on the %s side panicked: %v", e.side, o.err)
		return false
	}
	if o.err == nil {
		info.ResponseSize = filterObservedSize
	}
	return e.callEnded(t, obs, info, o.err, true)
}
