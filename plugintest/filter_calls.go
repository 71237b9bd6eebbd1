package plugintest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterOutcomeCheck leaves the filter free to answer, reject or pass on,
// and only asks that the caller can take what it returns.
func filterOutcomeCheck(t tb, e *filterEnv) {
	o, ok := e.invoke(t, t.Context(), e.info(), freshNext("outcome"))
	if !ok || o.err == nil {
		return
	}
	if o.nexts == 0 {
		e.checkRejection(t, o)
		return
	}
	e.checkRefusal(t, o)
}

func filterRequestMetadata(t tb, e *filterEnv) {
	for i, shape := range filterCallShapes() {
		if !filterRequestMetadataOf(t, e, shape, i == 0) {
			return
		}
	}
}

// filterRequestMetadataOf checks one call shape; first says whether it is
// the first call, whose answer by the filter itself skips the check. It
// reports whether to go on.
func filterRequestMetadataOf(t tb, e *filterEnv, shape filterCallShape, first bool) bool {
	info := e.info()
	info.Method = shape.method
	for k, v := range shape.metadata {
		info.Metadata[k] = v
	}
	want := info.Metadata.Clone()
	call := ""
	if shape.what != "" {
		call = shape.what + ": "
	}
	// Every attempt must carry the call's metadata, so each is recorded.
	var mu sync.Mutex
	var seen []*kernel.CallInfo
	next := func(_ context.Context, got *kernel.CallInfo, _ any) (any, error) {
		s := &kernel.CallInfo{Method: got.Method, Side: got.Side, Codec: got.Codec, Metadata: got.Metadata.Clone()}
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
		return &filterResp{}, nil
	}
	if first {
		if _, ok := e.passingCall(t, info, next); !ok {
			return false
		}
	} else {
		o, ok := e.invoke(t, t.Context(), info, next)
		switch {
		case !ok:
			return false
		case o.nexts == 0 && o.err != nil:
			t.Errorf("%sthe filter rejected the call (%v), which it let through with plain values", call, o.err)
			return false
		case o.nexts == 0:
			return true // an answer of its own
		}
	}
	mu.Lock()
	defer mu.Unlock()
	failed := false
	for i, s := range seen {
		attempt := call
		if len(seen) > 1 {
			attempt += "attempt " + strconv.Itoa(i+1) + ": "
		}
		for k, v := range want {
			if got, found := s.Metadata[k]; !found || got != v {
				t.Errorf("%srequest metadata %s reached next as %s (present: %v), want %s; a filter must pass metadata through, "+
					"whatever its length or characters", attempt, filterDescribe(k), filterDescribe(got), found, filterDescribe(v))
				failed = true
			}
		}
		if s.Method != shape.method || s.Side != e.side || s.Codec != filterCodec {
			t.Errorf("%snext saw method %s, side %s, codec %q; want %s, %s, %q as the caller set them",
				attempt, filterDescribe(s.Method), s.Side, s.Codec, filterDescribe(shape.method), e.side, filterCodec)
			failed = true
		}
	}
	return !failed
}

func filterResponseMetadata(t tb, e *filterEnv) {
	info := e.info()
	sent := kernel.Metadata{"plugintest-response": "from next"}
	for k, v := range filterUnusualMetadata() {
		sent[k] = v
	}
	_, ok := e.passingCall(t, info, func(_ context.Context, got *kernel.CallInfo, _ any) (any, error) {
		if e.side == kernel.ClientSide {
			// As the transport does: the answer's metadata replaces the
			// map, so a map shared between attempts is never written to.
			got.ResponseMetadata = sent.Clone()
		} else {
			for k, v := range sent {
				got.SetResponseMetadata(k, v)
			}
		}
		return &filterResp{}, nil
	})
	if !ok {
		return
	}
	for k, v := range sent {
		if got, found := info.ResponseMetadata[k]; !found || got != v {
			t.Errorf("response metadata %s set by next reached the caller as %s (present: %v), want %s; "+
				"a filter that calls next with another CallInfo must copy ResponseMetadata back, whole",
				filterDescribe(k), filterDescribe(got), found, filterDescribe(v))
		}
	}
}

func filterResponse(t tb, e *filterEnv) {
	// invoke has already failed a (nil, nil); any response is the filter's
	// to choose: next's, or its own in its place.
	o, ok := e.passingCall(t, e.info(), freshNext("the response"))
	if ok && o.err != nil {
		e.checkRefusal(t, o)
	}
}

func filterError(t tb, e *filterEnv) {
	statuses := []*kernel.Status{
		{Code: kernel.NotFound, Message: "plugintest: the handler's own error"},
		// A long message with lines and non-ASCII text, as a handler
		// reporting a validation failure in full sends.
		{Code: kernel.FailedPrecondition, Message: filterLongText("plugintest: a long error\nwith lines\tand ✓: ", filterLong)},
	}
	for i, want := range statuses {
		info := e.info()
		next := func(context.Context, *kernel.CallInfo, any) (any, error) { return nil, want }
		var o filterOutcome
		if i == 0 {
			var ok bool
			if o, ok = e.passingCall(t, info, next); !ok {
				return
			}
		} else {
			var ok bool
			if o, ok = e.invoke(t, t.Context(), info, next); !ok || o.nexts == 0 {
				return
			}
		}
		shown := filterDescribe(want.Error())
		switch {
		case o.err == nil:
			// A fallback: the filter answers in next's place, as the contract
			// allows (a stale cache entry, a default value). invoke has
			// failed a (nil, nil) already.
		case !errors.Is(o.err, want):
			t.Errorf("next failed with %s but the caller got %T %s, which neither is that error nor wraps it; "+
				"pass the error back, or wrap it with %%w (a status rebuilt with its message cut or changed is another error)",
				shown, o.err, filterDescribe(o.err.Error()))
		case kernel.CodeOf(o.err) != want.Code:
			t.Errorf("next failed with code %s but the caller got code %s", want.Code, kernel.CodeOf(o.err))
		}
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
	case o.nexts == 0 && o.err == nil:
		// An answer of the filter's own, from a cache say, costs the
		// caller nothing to take, cancelled or not.
	case o.nexts == 0 && !errors.Is(o.err, context.Canceled):
		// Returning ctx.Err() itself is as good as a Canceled status.
		e.checkRejection(t, o)
	case o.nexts > 0 && o.err == nil:
		t.Errorf("the caller's context was cancelled and next failed, but the call succeeded with %v", o.resp)
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
	if !ok || !e.reachedNext(t, o) {
		return
	}
	switch {
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
	var produced sync.Map // *filterResp → the id of the call next answered
	next := func(_ context.Context, info *kernel.CallInfo, req any) (any, error) {
		r, _ := req.(*filterReq)
		if r == nil || r.id != info.Metadata[filterMDKey] {
			return nil, kernel.Errorf(kernel.Internal, "plugintest: request %v arrived with metadata of call %q", req, info.Metadata[filterMDKey])
		}
		resp := &filterResp{id: r.id}
		produced.Store(resp, r.id)
		return resp, nil
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var rejected, answered atomic.Int32
	var lastRejection atomic.Pointer[error] // its types may differ from call to call
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
				switch {
				case o.nexts == 0 && o.err == nil:
					// Its own answer (a cache hit, a call coalesced with
					// another) may well be another call's response.
					answered.Add(1)
					continue
				case o.nexts == 0:
					// A filter shedding load may reject some calls of so
					// many at once; not all of them, checked below.
					rejected.Add(1)
					err := o.err
					lastRejection.Store(&err)
					e.checkRejection(t, o)
					continue
				}
				var owner any
				if r, isResp := o.resp.(*filterResp); isResp {
					owner, _ = produced.Load(r)
				}
				if o.err != nil || (owner != nil && owner != id) {
					t.Errorf("call %s got (%+v, %v) while other goroutines called the filter, want its own response %q; "+
						"keep no per-call state in the filter value", id, o.resp, o.err, id)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	const calls = filterGoroutines * filterCallsEach
	switch n := rejected.Load(); {
	case n == calls:
		e.rejectedPassing(t, *lastRejection.Load())
	case n+answered.Load() == calls:
		t.Skipf("the filter answered or rejected all %d calls by itself, so what it passes on cannot be checked", calls)
	}
}

// filterNilMetadata calls with info.Metadata nil, as the kernel passes a
// call that carries no metadata: a filter writing into the map panics.
func filterNilMetadata(t tb, e *filterEnv) {
	info := e.info()
	info.Metadata = nil
	o, finished := e.run(t.Context(), info, freshNext("nil metadata"))
	switch {
	case !finished:
		t.Fatalf("nil request metadata: Invoke on the %s side did not return within %s", e.side, e.patience())
	case o.panicked:
		t.Fatalf("nil request metadata: with info.Metadata == nil, as a call without metadata arrives, Invoke panicked: %v; "+
			"use info.SetRequestMetadata to add entries, which allocates the map", o.err)
	}
	if !e.checkOutcome(t, o) || o.nexts > 0 || o.err == nil {
		return
	}
	if len(e.cfg.Metadata) > 0 || e.cfg.RejectsEveryCall {
		// The filter needs metadata the call does not carry.
		e.checkRejection(t, o)
		return
	}
	t.Errorf("nil request metadata: the filter rejected a call that carries no metadata (%v), though FilterConfig.Metadata "+
		"is empty; set FilterConfig.Metadata to what the filter needs to let a call through (or FilterConfig.RejectsEveryCall, "+
		"if the filter is meant to reject every call)", o.err)
}

// filterRejectsEveryCall holds a filter to what FilterConfig.RejectsEveryCall
// says of it, with metadata and without.
func filterRejectsEveryCall(t tb, e *filterEnv) {
	withMD := e.info()
	withoutMD := e.info()
	withoutMD.Metadata = nil
	for _, info := range []*kernel.CallInfo{withMD, withoutMD} {
		o, ok := e.invoke(t, t.Context(), info, freshNext("passed"))
		switch {
		case !ok:
		case o.nexts > 0:
			t.Errorf("FilterConfig.RejectsEveryCall is set, but the filter passed a call (metadata %v) to next; "+
				"unset it, so that the suite checks what the filter passes on", info.Metadata)
		case o.err == nil:
			t.Errorf("FilterConfig.RejectsEveryCall is set, but the filter answered a call (metadata %v) with %T; "+
				"an answer is no rejection: unset it", info.Metadata, o.resp)
		default:
			e.checkRejection(t, o)
		}
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
	if !filterOptionNamed(err, cfg.BadOptionsKey) {
		t.Errorf("the error for bad options %v does not name the option %q: %v; say %s (as kernel.PluginError prints an "+
			"option), or return a *kernel.PluginError with Key %q: a key that is an ordinary word appears in messages "+
			"that do not name it", cfg.BadOptions, cfg.BadOptionsKey, err, filterOptionShape(cfg.BadOptionsKey), cfg.BadOptionsKey)
	}
}
