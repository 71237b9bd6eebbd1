package plugintest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// FilterConfig configures the Filter suite.
type FilterConfig struct {
	// Options is the filter's options block, as a config file would give
	// it; nil builds the filter from its defaults.
	Options map[string]any
	// BadOptions, merged over Options, must make the filter refuse to build
	// with an error naming BadOptionsKey. Nil skips that check.
	BadOptions    map[string]any
	BadOptionsKey string
	// Side is the side the filter is configured on; 0 runs every check on
	// both sides, or, for a filter that declares one (kernel.SidedFilter),
	// on that side, the only one the engine puts it on. A Side other than
	// the one declared fails the Side check.
	Side kernel.Side
	// Metadata is request metadata every call (and stream) the suite makes
	// carries, so that a filter which lets only some calls through (one
	// requiring a token, say) lets the suite's calls through. With Options,
	// it must make the filter pass the suite's calls and streams on: a
	// filter that rejects them fails the checks of what it passes on.
	// Stream/Refused opens a stream without it.
	Metadata kernel.Metadata
	// RejectsEveryCall declares a filter that is meant to reject every
	// call, whatever its options and metadata (a kill switch, a
	// maintenance mode), and every stream if it is a kernel.StreamFilter.
	// The checks of what a filter passes on are then skipped, saying so,
	// and RejectsEveryCall (Stream/Refused for streams) checks instead
	// that every call is rejected with a *kernel.Status without reaching
	// next.
	RejectsEveryCall bool
	// Patience bounds how long the suite waits for Invoke or InvokeStream
	// to return where it must return promptly; a filter still running
	// then fails the check. 0 means 10s: generous, since a loaded machine
	// is slow, yet far below a test's timeout.
	Patience time.Duration

	// stage is the client stage the filter declares (kernel.StagedFilter),
	// set by the Stage check.
	stage kernel.Stage
}

// Filter certifies the filter f builds. Each check runs as a subtest per
// side (Client, Server), on a fresh filter, with the suite's own next. A
// filter may answer a call by itself (a cache, a fallback) or reject it
// with a *kernel.Status, and the suite honours that; but the checks of what
// a filter passes on need the suite's calls to pass, so there a rejection
// fails, unless FilterConfig.RejectsEveryCall says the filter rejects every
// call, and an answer of the filter's own skips the check, saying so. It
// checks:
//
//   - Side: a filter that declares one side (kernel.SidedFilter) declares
//     the client or the server, and FilterConfig.Side, if set, is that one;
//     the checks below then run on that side only. A failure here ends the
//     suite.
//   - Stage: a filter that declares a client stage (kernel.StagedFilter)
//     declares call or attempt, as the engine requires; one that declares
//     the attempt stage is given, on the client, a CallInfo with the
//     picked instance (Instance, Peer, Attempt 1), as the engine gives it.
//     A failure here ends the suite.
//   - Outcome: whatever the filter does, its outcome is one a caller can
//     take: a response, next's or its own, or an error, a rejection being a
//     *kernel.Status. Never (nil, nil): the caller would get an empty reply
//     reported as a success. That holds in every check.
//   - RequestMetadata: every entry of info.Metadata reaches next unchanged
//     (a filter may add entries), as do Method, Side and Codec, in every
//     attempt the filter makes; also for calls whose metadata has long
//     (16 KiB), empty, multi-line, padded, NUL-bearing, non-ASCII and
//     separator-laden values and upper-case and long keys, and whose
//     method is 16 KiB long, has no dot or slash, has gRPC's form, or has
//     spaces and non-ASCII text.
//   - ResponseMetadata: what next sets in info.ResponseMetadata (the same
//     long and unusual entries) reaches the caller's CallInfo whole.
//   - Response: next's success reaches the caller as a success with a
//     response: next's or one the filter put in its place.
//   - Error: next's error comes back to the caller (itself or wrapped, with
//     its status code and message kept, a 16 KiB multi-line message too),
//     unless the filter answers in its place with a value of its own (a
//     fallback); never as an empty success.
//   - Methods: calls of several methods in turn, three rounds over
//     (methods sharing a long prefix, one a prefix of another, two that
//     differ only in case): no caller gets a response next produced for
//     another method, as a filter keeping state by a truncated or folded
//     method name would give.
//   - CancelledContext/Before: with the caller's context already cancelled,
//     the filter does not call next with a live context, and a call that
//     reached next does not succeed.
//   - CancelledContext/During: cancelling the caller's context while next
//     runs reaches next, so the call ends promptly.
//   - Concurrent: many goroutines calling one filter at once each get their
//     own response (or one the filter answered with itself), and next sees
//     each call's own metadata. Run with -race.
//   - NilMetadata: a call whose info.Metadata is nil, as a call without
//     metadata arrives, does not panic the filter (info.SetRequestMetadata
//     allocates the map) and, unless FilterConfig.Metadata is needed to
//     pass, reaches next.
//   - Attempts/Client: each call of next is an independent attempt with a
//     fresh response, the first of which fails as a retryable Unavailable
//     after waiting briefly for another to start. Two attempts in flight at
//     once must not share one *kernel.CallInfo, every attempt carries the
//     caller's metadata, and a response returned from one attempt comes
//     with that attempt's ResponseMetadata, not another's.
//   - Attempts/Server: next, the handler, is called at most once.
//   - AfterReturn: once Invoke returns, the filter neither calls next nor
//     formats the request (its String method) nor writes into the CallInfo;
//     the suite overwrites the CallInfo then and watches a while, so that
//     under -race a later read is reported as a race.
//   - Deadliner: for a kernel.Deadliner whose CallTimeout gives the
//     suite's method a deadline (skipped otherwise), CallTimeout returns
//     without blocking, and Invoke, given a ctx without a deadline, calls
//     next with that deadline or an earlier one: outside the engine,
//     which gives the deadline before any filter runs, Invoke must give
//     it itself.
//   - Admitter/{BeforeInvoke,Error,Panic,Cancelled}: for a kernel.Admitter
//     checked on the server side (skipped otherwise), what Admit takes is
//     given back however an admitted call ends: before Invoke (a later
//     Admitter refused it, its request did not decode), or in Invoke with
//     next failing, panicking or cancelled. A fresh filter is given 1024
//     calls in a row ending each way, made as the server makes them (Admit,
//     Invoke or not, then CallEnded for a kernel.CallObserver), and fails
//     if Admit refuses one while a fresh filter admits twice as many calls
//     that succeed; a filter that refuses those too (a rate limit) skips.
//   - CallObserver: for a kernel.CallObserver on the server side,
//     CallEnded returns without panicking or blocking (within Patience)
//     for calls that went through Invoke and for calls Invoke never saw
//     (handled false; metadata nil too), also from many goroutines at once.
//   - ContextValuer: for a kernel.ContextValuer on the server side
//     (skipped otherwise), CallValue, asked from within next and from
//     several goroutines at once as a handler's context asks it, answers
//     keys of the suite's own (a struct and a string) ok false, without
//     panicking or blocking (within Patience): the handler's context asks
//     it before the server's base context, whose values an answer hides.
//   - RejectsEveryCall: only with FilterConfig.RejectsEveryCall; every
//     call, with metadata or without, is rejected with a *kernel.Status and
//     never reaches next.
//   - BadOptions: BadOptions are refused by an error naming BadOptionsKey
//     as the kernel names an option: a *kernel.PluginError (or a
//     DecodeOptions error) with that Key, or option "KEY" in its text. The
//     key appearing as a word is not enough: "limit" is in "over the
//     limit" whatever the option.
//   - Stream: only for a filter that implements kernel.StreamFilter (else
//     skipped, saying so: the engine applies it to unary calls only). Its
//     InvokeStream is given an in-memory kernel.Stream, and next stands in
//     for the handler (server) or the caller's use of the stream (client):
//   - Stream/Messages: messages pass through whole and in order both ways,
//     sent and received at once as on a bidirectional stream; none, one
//     way only, and 64 each way. InvokeStream returns when next does, not
//     before.
//   - Stream/Metadata: request metadata (the unusual entries and methods
//     above), method, side and codec reach next unchanged; on the client
//     the trailers next writes into info.ResponseMetadata reach the
//     caller's CallInfo.
//   - Stream/FinalStatus: a stream next ends with a status (a 16 KiB
//     multi-line one too) does not end OK: the filter returns it, wraps it
//     or replaces it with a *kernel.Status of its own.
//   - Stream/NextOnce: next is called at most once, also when it fails as
//     a retryable Unavailable: a stream cannot be opened, or its handler
//     run, twice.
//   - Stream/Refused: a stream without FilterConfig.Metadata (its metadata
//     nil) does not panic the filter; a refusal is a *kernel.Status and
//     comes before next, never after it has run; a filter that needs no
//     metadata lets it through, and one FilterConfig.RejectsEveryCall
//     declares refuses every stream without calling next.
//   - Stream/CancelledContext/Before: with the stream's context already
//     cancelled, next is not called with a live context, and the stream
//     does not end OK. Stream/CancelledContext/During: cancelling it while
//     next waits for a message reaches next's context, and InvokeStream
//     returns.
//   - Stream/Concurrent: eight streams through one filter at once each
//     keep their own messages. Run with -race: one goroutine sends while
//     another receives, as the engine allows, so a wrapper's counters must
//     be safe for that.
//   - Stream/AfterReturn: once InvokeStream returns, the filter neither
//     calls SendMsg or RecvMsg on the stream nor writes into the CallInfo
//     (the suite overwrites it then and watches a while): it must not
//     keep info or st. A late SendMsg or RecvMsg fails any stream check
//     it is seen in.
//   - Stream/Leaks: once streams that passed, failed and were cancelled
//     have ended and the filter is closed, no goroutine started while
//     InvokeStream ran is left.
//   - In every stream check, InvokeStream must not return nil without
//     calling next (the client's caller would get no stream, the server's
//     stream would end OK with no handler run), must not refuse with
//     anything but a *kernel.Status, and must not turn next's status into
//     nil or into an error that neither wraps it nor is a status.
//   - Lifecycle and Options, as for every plugin kind.
//
// Wherever next is called, calling it after Invoke returned, and calling
// it twice at once with one *kernel.CallInfo, fail the check. A filter that
// panics fails the subtest it panicked in; one that does not return within
// FilterConfig.Patience fails it too.
func Filter(t *testing.T, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	filterSuite(wrap(t), f, cfg)
}

func filterSuite(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	if !t.Run("Side", func(t tb) { cfg = filterSided(t, f, cfg) }) {
		return // the checks would run on a side the engine never uses
	}
	if !t.Run("Stage", func(t tb) { cfg = filterStaged(t, f, cfg) }) {
		return // the engine refuses the filter's config
	}
	property := func(t tb, name string, check func(t tb, e *filterEnv)) {
		filterProperty(t, f, cfg, name, check)
	}
	// passing marks a check that needs the suite's calls to pass.
	passing := func(check func(t tb, e *filterEnv)) func(t tb, e *filterEnv) {
		return func(t tb, e *filterEnv) {
			if cfg.RejectsEveryCall {
				t.Skipf("FilterConfig.RejectsEveryCall is set: the filter rejects every call, so what it would pass on cannot be checked")
			}
			check(t, e)
		}
	}
	property(t, "Outcome", filterOutcomeCheck)
	property(t, "RequestMetadata", passing(filterRequestMetadata))
	property(t, "ResponseMetadata", passing(filterResponseMetadata))
	property(t, "Response", passing(filterResponse))
	property(t, "Error", passing(filterError))
	t.Run("CancelledContext", func(t tb) {
		property(t, "Before", filterCancelledBefore)
		property(t, "During", passing(filterCancelledDuring))
	})
	property(t, "Methods", passing(filterMethodsCheck))
	property(t, "Concurrent", passing(filterConcurrent))
	property(t, "NilMetadata", filterNilMetadata)
	property(t, "Attempts", passing(filterAttempts))
	property(t, "AfterReturn", filterAfterReturn)
	property(t, "Deadliner", passing(filterDeadliner))          // filter_deadliner.go
	t.Run("Admitter", func(t tb) { filterAdmitter(t, f, cfg) }) // filter_admitter.go
	property(t, "CallObserver", filterCallObserver)
	property(t, "ContextValuer", passing(filterContextValuer)) // filter_valuer.go
	if cfg.RejectsEveryCall {
		property(t, "RejectsEveryCall", filterRejectsEveryCall)
	}
	t.Run("BadOptions", func(t tb) { filterBadOptions(t, f, cfg) })
	t.Run("Stream", func(t tb) { filterStreamSuite(t, f, cfg) })

	lifecycle(t, f, cfg.Options, func(t tb, flt kernel.Filter) {
		t.Helper()
		e := &filterEnv{filter: flt, side: filterSides(cfg)[0], cfg: cfg}
		filterOutcomeCheck(t, e)
	})
}

// filterSides are the sides the suite checks: both, or the one
// FilterConfig.Side names.
func filterSides(cfg FilterConfig) []kernel.Side {
	if cfg.Side != 0 {
		return []kernel.Side{cfg.Side}
	}
	return []kernel.Side{kernel.ClientSide, kernel.ServerSide}
}

// filterProperty runs check as the subtest name, with a subtest per side
// each given a fresh filter, closed when it ends.
func filterProperty(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig, name string, check func(t tb, e *filterEnv)) {
	t.Run(name, func(t tb) {
		for _, side := range filterSides(cfg) {
			t.Run(filterSideName(side), func(t tb) {
				flt := build(t, f, cfg.Options)
				t.Cleanup(func() { closePlugin(flt) })
				check(t, &filterEnv{filter: flt, side: side, cfg: cfg})
			})
		}
	})
}

func filterSideName(s kernel.Side) string {
	switch s {
	case kernel.ClientSide:
		return "Client"
	case kernel.ServerSide:
		return "Server"
	}
	return "Side" + strconv.Itoa(int(s))
}

// filterEnv is one filter under test on one side.
type filterEnv struct {
	filter kernel.Filter
	side   kernel.Side
	cfg    FilterConfig
}

// filterResp is the response the suite's next answers with: a pointer, so
// that the suite can tell next's responses apart, and from the filter's.
type filterResp struct{ id string }

// filterReq is the request the suite passes. It reports being formatted
// after Invoke returned: a filter that keeps the request to log it later
// would log a request that by then belongs to another call.
type filterReq struct {
	id   string
	call *filterCall
}

func (r *filterReq) String() string {
	r.call.lateUse("formatted the request (called its String method)")
	return "plugintest request " + r.id
}

const (
	filterMethod = "PluginTest.Call"
	filterCodec  = "plugintest"
	filterMDKey  = "plugintest-call"
	// filterBound is FilterConfig.Patience's default, and how long the
	// suite's stream waits for a context that must end.
	filterBound = 10 * time.Second
	// filterCancelGrace is how long a cancellation may take to reach next.
	// Contexts derived with the context package are cancelled before
	// cancel returns, so this only allows for a slow machine.
	filterCancelGrace = 2 * time.Second
)

// patience is how long e waits for the filter to return (FilterConfig.Patience).
func (e *filterEnv) patience() time.Duration {
	if e.cfg.Patience > 0 {
		return e.cfg.Patience
	}
	return filterBound
}

// info returns a CallInfo as the kernel would build it on e's side.
func (e *filterEnv) info() *kernel.CallInfo {
	md := make(kernel.Metadata, len(e.cfg.Metadata)+1)
	for k, v := range e.cfg.Metadata {
		md[k] = v
	}
	md[filterMDKey] = "1"
	info := &kernel.CallInfo{Method: filterMethod, Side: e.side, Codec: filterCodec, Metadata: md}
	if e.side == kernel.ServerSide {
		info.Peer = "127.0.0.1:7000"
	}
	if e.side == kernel.ClientSide && e.cfg.stage == kernel.AttemptStage {
		// As the engine gives an attempt filter: after the pick.
		info.Instance = &kernel.Instance{Service: "plugintest", ID: "plugintest-1", Address: "127.0.0.1:7001"}
		info.Peer, info.Attempt = info.Instance.Address, 1
	}
	return info
}

// filterCall watches the next given to one Invoke, for breaches of the
// contract that only show there: an attempt started after Invoke returned,
// two attempts in flight with one CallInfo. It only records them, since
// they may happen on the filter's goroutines after the check has ended,
// when t must no longer be used.
type filterCall struct {
	mu       sync.Mutex
	returned bool                      // Invoke has returned
	inFlight map[*kernel.CallInfo]bool // the CallInfo of each next not yet returned
	nexts    int
	last     nextResult // what next returned last
	problems []string
	reported int // problems already reported
}

type nextResult struct {
	resp any
	err  error
}

func newFilterCall() *filterCall {
	return &filterCall{inFlight: make(map[*kernel.CallInfo]bool)}
}

// next wraps the check's next. A call it refuses does not reach the
// check's next, which then touches no CallInfo the filter may be using
// elsewhere: the suite's own accesses stay race-free, so that -race
// reports the filter's.
func (c *filterCall) next(inner kernel.Invoker) kernel.Invoker {
	return func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		c.mu.Lock()
		c.nexts++
		var refused string
		switch {
		case c.returned:
			refused = "next was called after Invoke returned: the filter kept info and req for later, " +
				"but both are reused for other calls once Invoke returns; start every attempt before returning"
		case info == nil:
			refused = "next was called with a nil *kernel.CallInfo; pass on the one Invoke received, or a copy"
		case c.inFlight[info]:
			refused = fmt.Sprintf("two calls of next in flight at once were given the same *kernel.CallInfo (%p); "+
				"next writes its attempt's outcome (Instance, Peer, Attempt, ResponseMetadata) into the CallInfo "+
				"it is given, so concurrent attempts would overwrite each other's: give each its own copy (ci := *info) "+
				"and copy the outcome of the attempt whose response is returned back into info", info)
		}
		if refused != "" {
			c.problems = append(c.problems, refused)
			c.mu.Unlock()
			return nil, kernel.Errorf(kernel.FailedPrecondition, "plugintest: %s", refused)
		}
		c.inFlight[info] = true
		c.mu.Unlock()
		resp, err := inner(ctx, info, req)
		c.mu.Lock()
		delete(c.inFlight, info)
		c.last = nextResult{resp, err}
		c.mu.Unlock()
		return resp, err
	}
}

// lateUse records what the filter did, if it did it after Invoke returned.
func (c *filterCall) lateUse(what string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.returned {
		c.problems = append(c.problems, "the filter "+what+" after Invoke returned: it kept req, "+
			"which is reused for another call once Invoke returns; take what it needs (a log line, a key) before returning")
	}
}

// report fails t with the problems recorded since the last report.
func (c *filterCall) report(t tb) {
	t.Helper()
	c.mu.Lock()
	fresh := c.problems[c.reported:]
	c.reported = len(c.problems)
	c.mu.Unlock()
	for _, p := range fresh {
		t.Errorf("%s", p)
	}
}

// filterOutcome is what one Invoke did.
type filterOutcome struct {
	resp     any
	err      error
	nexts    int  // how many times next was called before Invoke returned
	panicked bool // Invoke panicked; err says with what
	call     *filterCall
}

// run runs the filter with next on its own goroutine, so that a filter
// that panics or hangs fails t instead of the test binary; finished is
// false if it did not return within its patience.
func (e *filterEnv) run(ctx context.Context, info *kernel.CallInfo, next kernel.Invoker) (o filterOutcome, finished bool) {
	c := newFilterCall()
	req := &filterReq{id: info.Metadata[filterMDKey], call: c}
	done := make(chan filterOutcome, 1)
	go func() {
		var o filterOutcome
		defer func() {
			if p := recover(); p != nil {
				o = filterOutcome{panicked: true, err: fmt.Errorf("%v", p)}
			}
			c.mu.Lock()
			c.returned = true
			o.nexts = c.nexts
			c.mu.Unlock()
			o.call = c
			done <- o
		}()
		o.resp, o.err = e.filter.Invoke(ctx, info, req, c.next(next))
	}()
	select {
	case o := <-done:
		return o, true
	case <-time.After(e.patience()):
		return filterOutcome{call: c}, false
	}
}

// invoke runs the filter and reports what no check may accept: a panic, a
// hang, a breach recorded by next, and (nil, nil). ok is false when there
// is no outcome to check further.
func (e *filterEnv) invoke(t tb, ctx context.Context, info *kernel.CallInfo, next kernel.Invoker) (o filterOutcome, ok bool) {
	t.Helper()
	o, finished := e.run(ctx, info, next)
	switch {
	case !finished:
		t.Errorf("Invoke on the %s side did not return within %s", e.side, e.patience())
		return o, false
	case o.panicked:
		t.Errorf("Invoke on the %s side panicked: %v", e.side, o.err)
		return o, false
	}
	return o, e.checkOutcome(t, o)
}

// checkOutcome is invoke's part after the filter returned.
func (e *filterEnv) checkOutcome(t tb, o filterOutcome) bool {
	t.Helper()
	o.call.report(t)
	if o.resp != nil || o.err != nil {
		return true
	}
	if o.nexts == 0 {
		t.Errorf("the filter returned (nil, nil) without calling next: the caller would get an empty reply reported as a success; " +
			"answer with a response of the filter's own, call next, or reject the call with a *kernel.Status")
		return false
	}
	o.call.mu.Lock()
	last := o.call.last
	o.call.mu.Unlock()
	t.Errorf("the filter called next (which last returned (%T, %v)) and returned (nil, nil): the caller would get an empty reply "+
		"reported as a success; return next's response or error, or a response of the filter's own", last.resp, last.err)
	return false
}

// passingCall invokes the filter with a call the suite's config should let
// through, and reports whether it reached next.
func (e *filterEnv) passingCall(t tb, info *kernel.CallInfo, next kernel.Invoker) (filterOutcome, bool) {
	t.Helper()
	o, ok := e.invoke(t, t.Context(), info, next)
	if !ok {
		return o, false
	}
	return o, e.reachedNext(t, o)
}

// reachedNext reports whether o's call reached next. An answer of the
// filter's own is honoured, but leaves nothing to check of what it passes
// on, so it skips t; a rejection fails t, since the suite's FilterConfig is
// meant to let its calls through.
func (e *filterEnv) reachedNext(t tb, o filterOutcome) bool {
	t.Helper()
	if o.nexts > 0 {
		return true
	}
	if o.err == nil {
		t.Skipf("the filter answered the suite's call by itself (with a %T), so what it passes on to next cannot be checked", o.resp)
	}
	e.rejectedPassing(t, o.err)
	return false
}

// rejectedPassing fails t for a rejection of a call the suite's config
// should let through, so that a filter rejecting every call cannot pass the
// suite unchecked.
func (e *filterEnv) rejectedPassing(t tb, err error) {
	t.Helper()
	t.Errorf("the filter rejected a call its FilterConfig should let through: %T %q; set FilterConfig.Metadata or "+
		"FilterConfig.Options so that the suite's calls pass (or FilterConfig.RejectsEveryCall, if the filter is meant "+
		"to reject every call), since what a filter passes on can only be checked on calls it passes", err, err)
}

// checkRejection fails t unless o, a call that never reached next and
// ended with an error, ended with a *kernel.Status.
func (e *filterEnv) checkRejection(t tb, o filterOutcome) {
	t.Helper()
	var st *kernel.Status
	if !errors.As(o.err, &st) {
		t.Errorf("the filter rejected the call with %T %q, not a *kernel.Status; "+
			"reject with kernel.Errorf(code, ...) so the caller gets a code", o.err, o.err)
	}
}

// checkRefusal fails t unless the error with which the filter ended a call
// whose next succeeded is a *kernel.Status: turning a success into a
// failure is the filter's decision, and the caller must learn its code.
func (e *filterEnv) checkRefusal(t tb, o filterOutcome) {
	t.Helper()
	var st *kernel.Status
	if !errors.As(o.err, &st) {
		t.Errorf("next succeeded, but the filter returned %T %q, not a *kernel.Status; a filter that refuses next's answer "+
			"must say why with kernel.Errorf(code, ...); otherwise return next's response, or one of its own", o.err, o.err)
	}
}

// freshNext answers every call with a new response, as the transport and
// the handler do: each attempt's response is its own value.
func freshNext(id string) kernel.Invoker {
	return func(context.Context, *kernel.CallInfo, any) (any, error) { return &filterResp{id: id}, nil }
}
