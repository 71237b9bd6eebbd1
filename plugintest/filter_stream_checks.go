package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// streamMessagesCheck: messages pass through the filter whole and in
// order both ways, sent and received at once as on a bidirectional
// stream, for streams without messages, with messages one way only, and
// with many.
func streamMessagesCheck(t tb, e *streamEnv) {
	for _, n := range []struct{ sends, recvs int }{{0, 0}, {3, 0}, {0, 3}, {64, 64}} {
		call := newStreamCall()
		w := newStreamWire(t.Context(), call, "stream", n.recvs, io.EOF)
		o, ok := e.invoke(t, t.Context(), call, e.info(), w, e.streamApp(call, "stream", n.sends, n.recvs, nil))
		if !ok || !e.reachedNext(t, o) {
			return
		}
		checkSent(t, w, n.sends)
		if t.Failed() {
			t.Logf("the stream sent %d messages and received %d", n.sends, n.recvs)
			return
		}
	}
}

// streamMetadataCheck: the request metadata, method, side and codec
// reach next unchanged, for the unusual entries and methods the unary
// checks use; on the client the trailers next writes into info reach the
// caller's CallInfo. (On the server the engine keeps a handler's trailers
// in its own CallInfo, whatever the filters pass on, so there is nothing
// of the filter's to check.)
func streamMetadataCheck(t tb, e *streamEnv) {
	trailers := kernel.Metadata{"plugintest-trailer": "from next"}
	for k, v := range filterUnusualMetadata() {
		trailers[k] = v
	}
	for _, shape := range filterCallShapes() {
		info := e.info()
		info.Method = shape.method
		for k, v := range shape.metadata {
			info.Metadata[k] = v
		}
		want := info.Metadata.Clone()
		call := newStreamCall()
		var seen kernel.CallInfo
		next := func(ctx context.Context, got *kernel.CallInfo, st kernel.Stream) error {
			seen = kernel.CallInfo{Method: got.Method, Side: got.Side, Codec: got.Codec, Metadata: got.Metadata.Clone()}
			return e.streamApp(call, "stream", 0, 0, trailers)(ctx, got, st)
		}
		o, ok := e.invoke(t, t.Context(), call, info, newStreamWire(t.Context(), call, "stream", 0, io.EOF), next)
		if !ok || !e.reachedNext(t, o) {
			return
		}
		what := ""
		if shape.what != "" {
			what = strings.Replace(shape.what, "a call", "a stream", 1) + ": "
		}
		for k, v := range want {
			if got, found := seen.Metadata[k]; !found || got != v {
				t.Errorf("%srequest metadata %s reached next as %s (present: %v), want %s; a stream filter must pass "+
					"metadata through, whatever its length or characters", what, filterDescribe(k), filterDescribe(got), found, filterDescribe(v))
			}
		}
		if seen.Method != shape.method || seen.Side != e.side || seen.Codec != filterCodec {
			t.Errorf("%snext saw method %s, side %s, codec %q; want %s, %s, %q as the stream was opened with",
				what, filterDescribe(seen.Method), seen.Side, seen.Codec, filterDescribe(shape.method), e.side, filterCodec)
		}
		if e.side == kernel.ClientSide {
			for k, v := range trailers {
				if got, found := info.ResponseMetadata[k]; !found || got != v {
					t.Errorf("%strailer %s that next set reached the caller's CallInfo as %s (present: %v), want %s; a filter "+
						"that calls next with another CallInfo must copy ResponseMetadata back, whole",
						what, filterDescribe(k), filterDescribe(got), found, filterDescribe(v))
				}
			}
		}
		if t.Failed() {
			return
		}
	}
}

// streamFinalStatusCheck: a stream that next ends with a status (a
// handler's error, a server's answer) does not end OK: the filter returns
// that status, wraps it, or replaces it with a status of its own. The
// outcome check (checkOutcome) holds every stream to this; here next
// fails on purpose, with a plain status and with a long multi-line one.
func streamFinalStatusCheck(t tb, e *streamEnv) {
	for _, want := range []*kernel.Status{
		{Code: kernel.NotFound, Message: "plugintest: the handler's own error"},
		{Code: kernel.FailedPrecondition, Message: filterLongText("plugintest: a long error\nwith lines\tand ✓: ", filterLong)},
	} {
		call := newStreamCall()
		next := func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
			if err := e.streamApp(call, "stream", 1, 1, nil)(ctx, info, st); err != nil {
				return err
			}
			return want
		}
		o, ok := e.invoke(t, t.Context(), call, e.info(), newStreamWire(t.Context(), call, "stream", 1, io.EOF), next)
		if !ok || !e.reachedNext(t, o) {
			return
		}
		if errors.Is(o.err, want) && kernel.CodeOf(o.err) != want.Code {
			t.Errorf("next ended the stream with code %s, but the filter's error says code %s", want.Code, kernel.CodeOf(o.err))
		}
	}
}

// streamNextOnceCheck: a stream whose next fails as a retryable
// Unavailable, which a unary call's retry would send again, still calls
// next once: a stream cannot be opened twice, nor its handler run twice.
func streamNextOnceCheck(t tb, e *streamEnv) {
	call := newStreamCall()
	next := func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return &kernel.Status{Code: kernel.Unavailable, Message: "plugintest: the instance went away", Retryable: true}
	}
	o, ok := e.invoke(t, t.Context(), call, e.info(), newStreamWire(t.Context(), call, "stream", 0, io.EOF), next)
	if ok && o.nexts > 1 {
		// The wrapper has reported it; say what the call was.
		t.Logf("next failed as a retryable Unavailable, and the filter called it %d times", o.nexts)
	}
}

// streamRefusedCheck opens a stream without FilterConfig.Metadata (its
// request metadata nil, as a stream that carries none arrives). A filter
// that refuses it does so before next, with a *kernel.Status: once next
// has run, the handler has run (server) or the caller has used the
// stream (client). A filter FilterConfig.RejectsEveryCall declares
// refuses it, and one with metadata too; a filter that needs no metadata
// (FilterConfig.Metadata empty) lets it through.
func streamRefusedCheck(t tb, e *streamEnv) {
	infos := []*kernel.CallInfo{e.info()}
	infos[0].Metadata = nil
	if e.cfg.RejectsEveryCall {
		infos = append(infos, e.info())
	}
	for _, info := range infos {
		call := newStreamCall()
		var ran atomic.Bool
		next := func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
			ran.Store(true)
			return e.streamApp(call, "stream", 0, 0, nil)(ctx, info, st)
		}
		o, finished := e.run(t.Context(), call, info, newStreamWire(t.Context(), call, "stream", 0, io.EOF), next)
		switch {
		case !finished:
			t.Fatalf("InvokeStream on the %s side did not return within %s", e.side, e.patience())
		case o.panicked && strings.Contains(o.err.Error(), "nil map"):
			t.Fatalf("InvokeStream panicked on a stream whose request metadata is nil, as a stream without metadata "+
				"arrives: %v; use info.SetRequestMetadata to add entries, which allocates the map", o.err)
		case o.panicked:
			t.Fatalf("InvokeStream on the %s side panicked on a stream whose request metadata is nil: %v", e.side, o.err)
		}
		if !e.checkOutcome(t, o) {
			return
		}
		switch {
		case e.cfg.RejectsEveryCall && ran.Load():
			t.Errorf("FilterConfig.RejectsEveryCall is set, but the filter passed a stream (metadata %v) to next; "+
				"unset it, so that the suite checks what the filter passes on", info.Metadata)
		case e.cfg.RejectsEveryCall:
		case len(e.cfg.Metadata) > 0 && o.nexts > 0 && o.err != nil:
			t.Errorf("the filter let next run a stream without FilterConfig.Metadata, then failed it with %T %q; "+
				"refuse a stream before calling next: by the time next returns, the server's handler has run "+
				"(on the client, the caller has used the stream)", o.err, o.err)
		case len(e.cfg.Metadata) == 0 && o.nexts == 0:
			t.Errorf("the filter refused a stream that carries no metadata (%v), though FilterConfig.Metadata is empty; "+
				"set FilterConfig.Metadata to what the filter needs to let a stream through (or "+
				"FilterConfig.RejectsEveryCall, if the filter is meant to refuse everything)", o.err)
		}
	}
}

// streamCancelledBefore opens a stream whose context is already
// cancelled: the filter does not call next with a live context, and the
// stream does not end OK.
func streamCancelledBefore(t tb, e *streamEnv) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	call := newStreamCall()
	var live atomic.Bool
	next := func(ctx context.Context, _ *kernel.CallInfo, _ kernel.Stream) error {
		if ctx.Err() == nil {
			live.Store(true)
		}
		return kernel.StatusOf(context.Canceled)
	}
	o, finished := e.run(ctx, call, e.info(), newStreamWire(ctx, call, "stream", 0, nil), next)
	switch {
	case !finished:
		t.Fatalf("InvokeStream with a cancelled context did not return within %s", e.patience())
	case o.panicked:
		t.Fatalf("InvokeStream with a cancelled context panicked: %v", o.err)
	case o.nexts == 0 && errors.Is(o.err, context.Canceled):
		// Returning ctx.Err() itself is as good as a Canceled status.
		o.call.report(t)
	default:
		e.checkOutcome(t, o)
	}
	if live.Load() {
		t.Errorf("the stream's context was cancelled, but the filter called next with a live context; " +
			"derive next's context from the one InvokeStream received (context.WithoutCancel or Background loses the cancellation)")
	}
}

// streamCancelledDuring cancels a stream's context while next waits for
// a message: the cancellation reaches next's context, the wait ends (the
// engine's RecvMsg returns Canceled once the stream's context ends), and
// InvokeStream returns, not OK.
func streamCancelledDuring(t tb, e *streamEnv) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	call := newStreamCall()
	started := make(chan struct{})
	var reached atomic.Bool
	next := func(nctx context.Context, _ *kernel.CallInfo, st kernel.Stream) error {
		close(started)
		err := st.RecvMsg(new(streamMsg))
		select {
		case <-nctx.Done():
			reached.Store(true)
		case <-time.After(filterCancelGrace):
		}
		if err == nil {
			err = kernel.Errorf(kernel.Internal, "plugintest: a message arrived on a stream that carries none")
		}
		return err
	}
	go func() {
		select {
		case <-started:
			cancel()
		case <-ctx.Done():
		}
	}()
	o, ok := e.invoke(t, ctx, call, e.info(), newStreamWire(ctx, call, "stream", 0, nil), next)
	if !ok || !e.reachedNext(t, o) {
		return
	}
	if !reached.Load() {
		t.Errorf("the stream's context was cancelled while next ran, but next's context was not cancelled within %s; "+
			"derive next's context from the one InvokeStream received", filterCancelGrace)
	}
}

const (
	streamsAtOnce  = 8
	streamMessages = 32
)

// streamConcurrentCheck runs streams through one filter at once, each
// sending and receiving messages of its own: none gets another's, as a
// filter keeping the stream in the filter value would give. Run with
// -race.
func streamConcurrentCheck(t tb, e *streamEnv) {
	var wg sync.WaitGroup
	var refused atomic.Int32
	for g := range streamsAtOnce {
		wg.Go(func() {
			id := fmt.Sprintf("stream-%d", g)
			call := newStreamCall()
			w := newStreamWire(t.Context(), call, id, streamMessages, io.EOF)
			o, ok := e.invoke(t, t.Context(), call, e.info(), w, e.streamApp(call, id, streamMessages, streamMessages, nil))
			switch {
			case !ok:
			case o.nexts == 0:
				refused.Add(1) // a filter shedding load may refuse some of many at once
			default:
				o.call.report(t)
				checkSent(t, w, streamMessages)
			}
		})
	}
	wg.Wait()
	if n := refused.Load(); n == streamsAtOnce && !t.Failed() {
		t.Errorf("the filter refused all %d streams opened at once, which its FilterConfig lets through one at a time", n)
	}
}

// streamAfterReturnCheck: once InvokeStream returns, the filter neither
// uses the stream nor writes into the CallInfo, as kernel.StreamFilter
// requires. The suite overwrites the CallInfo then and watches a while,
// as AfterReturn does for Invoke, so that under -race a later read is
// reported as a race too; the wire records a late SendMsg or RecvMsg.
func streamAfterReturnCheck(t tb, e *streamEnv) {
	call := newStreamCall()
	info := e.info()
	w := newStreamWire(t.Context(), call, "stream", 3, io.EOF)
	o, ok := e.invoke(t, t.Context(), call, info, w, e.streamApp(call, "stream", 3, 3, kernel.Metadata{"plugintest-trailer": "1"}))
	if !ok || !e.reachedNext(t, o) {
		return
	}
	watchAfterReturn(t, info, "InvokeStream", call.report)
}

// streamLeaksCheck runs streams that pass, fail and are cancelled, then
// closes the filter, and expects every goroutine the filter started for
// them to have ended: a stream filter runs for its stream's life, and
// whatever it starts for a stream ends with it (or, if the filter keeps
// a worker, when the filter is closed). Only goroutines descending from
// those that ran InvokeStream are counted, so other tests running at
// once are not blamed.
func streamLeaksCheck(t tb, e *streamEnv) {
	left := make(chan []string, 1)
	go func() { left <- e.streamLeaks(t) }()
	stacks := <-left
	if len(stacks) > 0 {
		t.Errorf("%d goroutines started while the filter ran streams still run %s after every stream ended and the "+
			"filter was closed; end what a stream starts when InvokeStream returns:\n%s",
			len(stacks), filterCancelGrace, strings.Join(stacks, "\n\n"))
	}
}

// streamLeaks runs the streams on a goroutine of its own, the root of
// the goroutines counted, and returns the stacks of those left.
func (e *streamEnv) streamLeaks(t tb) []string {
	tree := newGoroutineTree()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	run := func(ctx context.Context, w *streamWire, call *streamCall, next kernel.StreamInvoker) {
		e.runHooked(ctx, call, e.info(), w, next, func() { tree.snapshot() })
	}
	call := newStreamCall()
	run(ctx, newStreamWire(ctx, call, "passes", 8, io.EOF), call, e.streamApp(call, "passes", 8, 8, nil))
	call = newStreamCall()
	run(ctx, newStreamWire(ctx, call, "fails", 1, io.EOF), call, func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		_ = st.SendMsg(&streamMsg{stream: "fails"})
		return kernel.Errorf(kernel.Internal, "plugintest: the handler failed")
	})
	cancelled, stop := context.WithCancel(ctx)
	call = newStreamCall()
	started := make(chan struct{})
	go func() {
		select {
		case <-started:
			stop()
		case <-cancelled.Done():
		}
	}()
	run(cancelled, newStreamWire(cancelled, call, "cancelled", 0, nil), call, func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		close(started)
		return st.RecvMsg(new(streamMsg))
	})
	stop()
	tree.snapshot()
	closePlugin(e.filterEnv.filter)
	cancel()
	return tree.await(filterCancelGrace)
}

// runHooked is run, calling hook on InvokeStream's goroutine once it
// returned, so that a snapshot taken there sees the goroutines it started
// while their parent still lives.
func (e *streamEnv) runHooked(ctx context.Context, call *streamCall, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker, hook func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer hook()
		defer func() { _ = recover() }() // the other checks report panics
		_ = e.filter.InvokeStream(ctx, info, st, call.next(next))
	}()
	select {
	case <-done:
	case <-time.After(e.patience()):
	}
}
