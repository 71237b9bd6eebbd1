package plugintest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// both sides.
	Side kernel.Side
	// Metadata is request metadata every call the suite makes carries, so
	// that a filter which lets only some calls through (one requiring a
	// token, say) lets the suite's calls through.
	Metadata kernel.Metadata
}

// Filter certifies the filter f builds. Each check runs as a subtest per
// side (Client, Server), on a fresh filter, with the suite's own handler as
// next. A filter may always reject a call by returning a *kernel.Status
// without calling next; a check that needs the call to pass is skipped,
// saying so, when the filter rejects it. It checks:
//
//   - NextAtMostOnce: next is called at most once, and a call that does not
//     reach next ends with a *kernel.Status error.
//   - RequestMetadata: every entry of info.Metadata reaches next unchanged
//     (a filter may add entries), as do Method, Side and Codec.
//   - ResponseMetadata: what next sets in info.ResponseMetadata reaches the
//     caller's CallInfo.
//   - Response: next's response comes back to the caller unchanged.
//   - Error: next's error comes back to the caller (itself or wrapped, with
//     its status code kept), and the response is not mistaken for success.
//   - CancelledContext/Before: with the caller's context already cancelled,
//     the filter returns promptly and does not call next with a live
//     context.
//   - CancelledContext/During: cancelling the caller's context while next
//     runs reaches next, so the call ends promptly.
//   - Concurrent: many goroutines calling one filter at once each get their
//     own response, and next sees each call's own metadata. Run with -race.
//   - BadOptions: BadOptions are refused by an error naming BadOptionsKey.
//   - Lifecycle and Options, as for every plugin kind.
//
// A filter that panics fails the subtest it panicked in; one that does not
// return within a bound fails it too.
func Filter(t *testing.T, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	filterSuite(wrap(t), f, cfg)
}

func filterSuite(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	sides := []kernel.Side{kernel.ClientSide, kernel.ServerSide}
	if cfg.Side != 0 {
		sides = []kernel.Side{cfg.Side}
	}
	property := func(t tb, name string, check func(t tb, e *filterEnv)) {
		t.Run(name, func(t tb) {
			for _, side := range sides {
				t.Run(filterSideName(side), func(t tb) {
					flt := build(t, f, cfg.Options)
					t.Cleanup(func() { closePlugin(flt) })
					check(t, &filterEnv{filter: flt, side: side, cfg: cfg})
				})
			}
		})
	}
	property(t, "NextAtMostOnce", filterNextAtMostOnce)
	property(t, "RequestMetadata", filterRequestMetadata)
	property(t, "ResponseMetadata", filterResponseMetadata)
	property(t, "Response", filterResponse)
	property(t, "Error", filterError)
	t.Run("CancelledContext", func(t tb) {
		property(t, "Before", filterCancelledBefore)
		property(t, "During", filterCancelledDuring)
	})
	property(t, "Concurrent", filterConcurrent)
	t.Run("BadOptions", func(t tb) { filterBadOptions(t, f, cfg) })

	lifecycle(t, f, cfg.Options, func(t tb, flt kernel.Filter) {
		t.Helper()
		e := &filterEnv{filter: flt, side: sides[0], cfg: cfg}
		filterNextAtMostOnce(t, e)
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

// filterReq and filterResp are the request and response the suite passes:
// pointers, so that "unchanged" means the very same value.
type filterReq struct{ id string }
type filterResp struct{ id string }

const (
	filterMethod = "PluginTest.Call"
	filterCodec  = "plugintest"
	filterMDKey  = "plugintest-call"
	// filterBound is how long a filter may take to return where it must
	// return promptly: generous, since a loaded machine is slow, yet far
	// below a test's timeout.
	filterBound = 10 * time.Second
	// filterCancelGrace is how long a cancellation may take to reach next.
	// Contexts derived with the context package are cancelled before
	// cancel returns, so this only allows for a slow machine.
	filterCancelGrace = 2 * time.Second
)

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
	return info
}

// filterOutcome is what one Invoke did.
type filterOutcome struct {
	resp     any
	err      error
	nexts    int  // how many times next was called
	panicked bool // Invoke panicked; err says with what
}

// invoke runs the filter with next on its own goroutine, so that a filter
// that panics or hangs fails t instead of the test binary.
func (e *filterEnv) invoke(t tb, ctx context.Context, info *kernel.CallInfo, next kernel.Invoker) (filterOutcome, bool) {
	t.Helper()
	var nexts atomic.Int32
	counted := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		nexts.Add(1)
		return next(ctx, info, req)
	}
	done := make(chan filterOutcome, 1)
	go func() {
		var o filterOutcome
		defer func() {
			if p := recover(); p != nil {
				o = filterOutcome{panicked: true, err: fmt.Errorf("%v", p)}
			}
			o.nexts = int(nexts.Load())
			done <- o
		}()
		o.resp, o.err = e.filter.Invoke(ctx, info, &filterReq{id: info.Metadata[filterMDKey]}, counted)
	}()
	select {
	case o := <-done:
		if o.panicked {
			t.Errorf("Invoke on the %s side panicked: %v", e.side, o.err)
			return o, false
		}
		return o, true
	case <-time.After(filterBound):
		t.Errorf("Invoke on the %s side did not return within %s", e.side, filterBound)
		return filterOutcome{}, false
	}
}

// passingCall invokes the filter and reports whether the call reached next;
// a rejection skips t, saying why, and anything else fails it.
func (e *filterEnv) passingCall(t tb, info *kernel.CallInfo, next kernel.Invoker) (filterOutcome, bool) {
	t.Helper()
	o, ok := e.invoke(t, t.Context(), info, next)
	if !ok {
		return o, false
	}
	if o.nexts == 0 {
		e.checkRejection(t, o)
		if !t.Failed() {
			t.Skipf("the filter rejected the suite's call (%v), so what it passes on cannot be checked; "+
				"set FilterConfig.Options or FilterConfig.Metadata so that calls pass", o.err)
		}
		return o, false
	}
	if o.nexts > 1 {
		t.Errorf("the filter called next %d times for one call; it must call next at most once", o.nexts)
	}
	return o, true
}

// checkRejection fails t unless o, a call that never reached next, ended
// with a *kernel.Status.
func (e *filterEnv) checkRejection(t tb, o filterOutcome) {
	t.Helper()
	var st *kernel.Status
	switch {
	case o.err == nil:
		t.Errorf("the filter returned (%v, nil) without calling next; call next, or reject the call with a *kernel.Status", o.resp)
	case !errors.As(o.err, &st):
		t.Errorf("the filter rejected the call with %T %q, not a *kernel.Status; "+
			"reject with kernel.Errorf(code, ...) so the caller gets a code", o.err, o.err)
	}
}

func filterNextAtMostOnce(t tb, e *filterEnv) {
	resp := &filterResp{id: "once"}
	o, ok := e.invoke(t, t.Context(), e.info(), func(context.Context, *kernel.CallInfo, any) (any, error) { return resp, nil })
	if !ok {
		return
	}
	switch o.nexts {
	case 0:
		e.checkRejection(t, o)
	case 1:
	default:
		t.Errorf("the filter called next %d times for one call; it must call next at most once "+
			"(a second call repeats the request's side effects)", o.nexts)
	}
}

func filterRequestMetadata(t tb, e *filterEnv) {
	info := e.info()
	info.Metadata["plugintest-a"] = "alpha"
	info.Metadata["plugintest-b"] = "b=1; c=2 ✓"
	want := info.Metadata.Clone()
	var seen *kernel.CallInfo
	_, ok := e.passingCall(t, info, func(_ context.Context, got *kernel.CallInfo, _ any) (any, error) {
		seen = &kernel.CallInfo{Method: got.Method, Side: got.Side, Codec: got.Codec, Metadata: got.Metadata.Clone()}
		return &filterResp{}, nil
	})
	if !ok {
		return
	}
	for k, v := range want {
		if got, found := seen.Metadata[k]; !found || got != v {
			t.Errorf("request metadata %q reached next as %q (present: %v), want %q; a filter must pass metadata through", k, got, found, v)
		}
	}
	if seen.Method != filterMethod || seen.Side != e.side || seen.Codec != filterCodec {
		t.Errorf("next saw method %q, side %s, codec %q; want %q, %s, %q as the caller set them",
			seen.Method, seen.Side, seen.Codec, filterMethod, e.side, filterCodec)
	}
}

func filterResponseMetadata(t tb, e *filterEnv) {
	info := e.info()
	_, ok := e.passingCall(t, info, func(_ context.Context, got *kernel.CallInfo, _ any) (any, error) {
		got.SetResponseMetadata("plugintest-response", "from next")
		return &filterResp{}, nil
	})
	if !ok {
		return
	}
	if got := info.ResponseMetadata["plugintest-response"]; got != "from next" {
		t.Errorf("response metadata set by next reached the caller as %q, want %q; "+
			"a filter that calls next with another CallInfo must copy ResponseMetadata back", got, "from next")
	}
}

func filterResponse(t tb, e *filterEnv) {
	want := &filterResp{id: "the response"}
	o, ok := e.passingCall(t, e.info(), func(context.Context, *kernel.CallInfo, any) (any, error) { return want, nil })
	if !ok {
		return
	}
	if o.err != nil {
		t.Errorf("next succeeded but the filter returned error %v; it must pass next's outcome back", o.err)
	}
	if got, _ := o.resp.(*filterResp); got != want {
		t.Errorf("next returned %p (%+v) but the caller got %T %+v; a filter must pass the response back unchanged", want, want, o.resp, o.resp)
	}
}

func filterError(t tb, e *filterEnv) {
	want := &kernel.Status{Code: kernel.NotFound, Message: "plugintest: the handler's own error"}
	o, ok := e.passingCall(t, e.info(), func(context.Context, *kernel.CallInfo, any) (any, error) { return nil, want })
	if !ok {
		return
	}
	switch {
	case o.err == nil:
		t.Errorf("next failed with %v but the filter returned (%v, nil); a filter must not swallow errors", want, o.resp)
	case !errors.Is(o.err, want):
		t.Errorf("next failed with %v but the caller got %T %q, which neither is that error nor wraps it; "+
			"pass the error back, or wrap it with %%w", want, o.err, o.err)
	case kernel.CodeOf(o.err) != want.Code:
		t.Errorf("next failed with code %s but the caller got code %s", want.Code, kernel.CodeOf(o.err))
	}
}

func filterCancelledBefore(t tb, e *filterEnv) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var live atomic.Bool
	o, ok := e.invoke(t, ctx, e.info(), func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
		if ctx.Err() == nil {
			live.Store(true)
		}
		return nil, kernel.StatusOf(context.Canceled)
	})
	if !ok {
		return
	}
	if live.Load() {
		t.Errorf("the caller's context was cancelled, but the filter called next with a live context; " +
			"derive next's context from the caller's (context.WithoutCancel or Background loses the cancellation)")
	}
	switch {
	case o.err == nil:
		t.Errorf("the caller's context was cancelled, but the call succeeded with %v", o.resp)
	case o.nexts == 0 && !errors.Is(o.err, context.Canceled):
		// Returning ctx.Err() itself is as good as a Canceled status.
		e.checkRejection(t, o)
	}
}

func filterCancelledDuring(t tb, e *filterEnv) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	var once sync.Once
	var reached atomic.Bool
	next := func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
		once.Do(func() { close(started) })
		// Bounded, so that a filter which loses the cancellation fails the
		// check instead of hanging it.
		select {
		case <-ctx.Done():
			reached.Store(true)
			return nil, kernel.StatusOf(ctx.Err())
		case <-time.After(filterCancelGrace):
			return nil, kernel.Errorf(kernel.DeadlineExceeded, "plugintest: next's context was never cancelled")
		}
	}
	go func() {
		select {
		case <-started:
			cancel()
		case <-ctx.Done():
		}
	}()
	o, ok := e.invoke(t, ctx, e.info(), next)
	if !ok {
		return
	}
	switch {
	case o.nexts == 0:
		e.checkRejection(t, o)
	case !reached.Load():
		t.Errorf("the caller cancelled while next ran, but next's context was not cancelled within %s; "+
			"derive next's context from the caller's", filterCancelGrace)
	case o.err == nil:
		t.Errorf("the call was cancelled, but the filter returned success (%v)", o.resp)
	}
}

const (
	filterGoroutines = 16
	filterCallsEach  = 32
)

func filterConcurrent(t tb, e *filterEnv) {
	// next answers from the metadata it sees, so a filter that hands one
	// call's CallInfo to another's next gives a caller the wrong response.
	// It only reads: writes to a shared CallInfo would be the filter's race,
	// but the suite's own must not obscure it.
	next := func(_ context.Context, info *kernel.CallInfo, req any) (any, error) {
		r, _ := req.(*filterReq)
		if r == nil || r.id != info.Metadata[filterMDKey] {
			return nil, kernel.Errorf(kernel.Internal, "plugintest: request %+v arrived with metadata of call %q", req, info.Metadata[filterMDKey])
		}
		return &filterResp{id: info.Metadata[filterMDKey]}, nil
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var rejected atomic.Int32
	for g := range filterGoroutines {
		wg.Go(func() {
			<-start
			for i := range filterCallsEach {
				if t.Failed() {
					return // one report is enough; the rest would repeat it
				}
				id := strconv.Itoa(g) + "/" + strconv.Itoa(i)
				info := e.info()
				info.Metadata[filterMDKey] = id
				o, ok := e.invoke(t, t.Context(), info, next)
				if !ok {
					return
				}
				if o.nexts == 0 {
					rejected.Add(1)
					e.checkRejection(t, o)
					continue
				}
				if got, _ := o.resp.(*filterResp); o.err != nil || got == nil || got.id != id {
					t.Errorf("call %s got (%+v, %v) while other goroutines called the filter, want its own response %q; "+
						"keep no per-call state in the filter value", id, o.resp, o.err, id)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if n := rejected.Load(); n == filterGoroutines*filterCallsEach {
		t.Skipf("the filter rejected all %d calls, so their responses cannot be checked", n)
	}
}

func filterBadOptions(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	if cfg.BadOptions == nil {
		t.Skipf("FilterConfig.BadOptions is nil; give options %q must refuse to check that it names the bad one", f.Name)
	}
	if cfg.BadOptionsKey == "" {
		t.Fatalf("FilterConfig.BadOptions is set but BadOptionsKey is empty; name the key the error must mention")
	}
	opts := make(map[string]any, len(cfg.Options)+len(cfg.BadOptions))
	for k, v := range cfg.Options {
		opts[k] = v
	}
	for k, v := range cfg.BadOptions {
		opts[k] = v
	}
	p, err := f.Build(opts, "plugintest.yaml")
	if err == nil {
		closePlugin(p)
		t.Fatalf("building %q with bad options %v succeeded; validate options in New and name the bad one", f.Name, cfg.BadOptions)
	}
	if !strings.Contains(err.Error(), cfg.BadOptionsKey) {
		t.Errorf("the error for bad options %v does not name %q: %v", cfg.BadOptions, cfg.BadOptionsKey, err)
	}
}
