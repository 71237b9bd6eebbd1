package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterStreamSuite certifies the stream form of a filter that implements
// kernel.StreamFilter, and skips, saying so, for one that does not: the
// engine applies such a filter to unary calls only. Each check runs per
// side on a fresh filter, as the unary ones do; the stream the filter is
// given is an in-memory one (streamWire) and next is the suite's stand-in
// for the handler (server) or the caller's use of the stream (client).
func filterStreamSuite(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) {
	t.Helper()
	probe := build(t, f, cfg.Options)
	_, streams := probe.(kernel.StreamFilter)
	closePlugin(probe)
	if !streams {
		t.Skipf("the filter does not implement kernel.StreamFilter: the engine applies it to unary calls only, "+
			"so it has no stream form to certify (%T)", probe)
	}
	property := func(t tb, name string, check func(t tb, e *streamEnv)) {
		filterProperty(t, f, cfg, name, func(t tb, fe *filterEnv) {
			check(t, &streamEnv{filterEnv: fe, filter: fe.filter.(kernel.StreamFilter)})
		})
	}
	passing := func(check func(t tb, e *streamEnv)) func(t tb, e *streamEnv) {
		return func(t tb, e *streamEnv) {
			if cfg.RejectsEveryCall {
				t.Skipf("FilterConfig.RejectsEveryCall is set: the filter refuses every stream, so what it would pass on cannot be checked")
			}
			check(t, e)
		}
	}
	property(t, "Messages", passing(streamMessagesCheck))
	property(t, "Metadata", passing(streamMetadataCheck))
	property(t, "FinalStatus", passing(streamFinalStatusCheck))
	property(t, "NextOnce", passing(streamNextOnceCheck))
	property(t, "Refused", streamRefusedCheck)
	t.Run("CancelledContext", func(t tb) {
		property(t, "Before", streamCancelledBefore)
		property(t, "During", passing(streamCancelledDuring))
	})
	property(t, "Concurrent", passing(streamConcurrentCheck))
	property(t, "AfterReturn", passing(streamAfterReturnCheck))
	property(t, "Leaks", streamLeaksCheck)
}

// streamEnv is one stream filter under test on one side.
type streamEnv struct {
	*filterEnv
	filter kernel.StreamFilter
}

// streamMsg is a message of the suite's streams: which stream it belongs
// to, and its place among the messages sent one way.
type streamMsg struct {
	stream string
	seq    int
}

// streamWire is the suite's in-memory kernel.Stream: the stream as the
// engine hands it to the outermost filter. RecvMsg hands out the messages
// it was loaded with, in order, then its end; SendMsg records what
// reaches it. Like the engine's, it is bound to the stream's context: a
// RecvMsg waiting for a message that will not come (end nil) returns a
// Canceled status once that context ends.
type streamWire struct {
	ctx    context.Context
	stream string
	call   *streamCall // where problems go

	mu       sync.Mutex
	incoming int   // messages RecvMsg hands out
	received int   // how many it has handed out
	end      error // what RecvMsg returns after them; nil: wait for ctx
	sent     []int // the seq of every message SendMsg was given, in order
}

var _ kernel.Stream = (*streamWire)(nil)

func newStreamWire(ctx context.Context, call *streamCall, stream string, incoming int, end error) *streamWire {
	return &streamWire{ctx: ctx, call: call, stream: stream, incoming: incoming, end: end}
}

func (w *streamWire) SendMsg(m any) error {
	w.call.lateUse("called SendMsg on the stream")
	msg, ok := m.(*streamMsg)
	switch {
	case !ok:
		w.call.problem(fmt.Sprintf("SendMsg reached the stream with a %T, not the message the caller sent; "+
			"pass the caller's message on", m))
		return kernel.Errorf(kernel.Internal, "plugintest: SendMsg was given a %T", m)
	case msg.stream != w.stream:
		w.call.problem(fmt.Sprintf("a message of stream %q was sent on stream %q: the filter mixed up two streams "+
			"open at once; keep no per-stream state in the filter value", msg.stream, w.stream))
		return kernel.Errorf(kernel.Internal, "plugintest: a message of another stream")
	}
	w.mu.Lock()
	w.sent = append(w.sent, msg.seq)
	w.mu.Unlock()
	return nil
}

func (w *streamWire) RecvMsg(m any) error {
	w.call.lateUse("called RecvMsg on the stream")
	msg, ok := m.(*streamMsg)
	if !ok || msg == nil {
		w.call.problem(fmt.Sprintf("RecvMsg reached the stream with a %T, not the caller's message; pass the caller's m on, "+
			"so that the message is decoded into it", m))
		return kernel.Errorf(kernel.Internal, "plugintest: RecvMsg was given a %T", m)
	}
	w.mu.Lock()
	if w.received < w.incoming {
		msg.stream, msg.seq = w.stream, w.received
		w.received++
		w.mu.Unlock()
		return nil
	}
	end := w.end
	w.mu.Unlock()
	if end != nil {
		return end
	}
	// Bounded, so that a check whose filter loses the cancellation fails
	// instead of hanging.
	select {
	case <-w.ctx.Done():
		return kernel.StatusOf(w.ctx.Err())
	case <-time.After(filterBound):
		return kernel.Errorf(kernel.DeadlineExceeded, "plugintest: the stream's context never ended")
	}
}

// sentSeqs is what reached the wire, in order.
func (w *streamWire) sentSeqs() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.sent...)
}

// streamCall watches one InvokeStream: its next, and the problems the
// wire and the suite's next found, which they record rather than report
// since they may run after the check ended.
type streamCall struct {
	mu       sync.Mutex
	returned bool // InvokeStream has returned
	nexts    int
	running  int   // calls of next not yet returned
	nextErr  error // what the first next returned
	nextDone bool
	ended    chan struct{} // closed when the first next returns
	problems []string
	reported int
}

func newStreamCall() *streamCall { return &streamCall{ended: make(chan struct{})} }

func (c *streamCall) problem(p string) {
	c.mu.Lock()
	c.problems = append(c.problems, p)
	c.mu.Unlock()
}

// lateUse records what the filter did to the stream, if it did it after
// InvokeStream returned: by then the engine has ended the stream and may
// reuse what it was made of for another.
func (c *streamCall) lateUse(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.returned {
		c.problems = append(c.problems, "the filter "+what+" after InvokeStream returned: it kept st, which must not "+
			"outlive InvokeStream; finish with the stream (and any wrapper of it) before returning")
	}
}

// next wraps the check's next: a second call, a call after InvokeStream
// returned or one without a stream is refused and recorded, and does not
// reach the check's next.
func (c *streamCall) next(inner kernel.StreamInvoker) kernel.StreamInvoker {
	return func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		c.mu.Lock()
		c.nexts++
		var refused string
		switch {
		case c.returned:
			refused = "next was called after InvokeStream returned: a stream filter runs for the stream's whole life " +
				"and must call next, at most once, before it returns"
		case c.nexts > 1:
			refused = fmt.Sprintf("next was called %d times for one stream; a stream filter calls next at most once: "+
				"on the server next runs the handler, and on the client it opens the stream and hands it to its caller, "+
				"neither of which can be done twice (a retry or hedge has no stream form)", c.nexts)
		case info == nil:
			refused = "next was called with a nil *kernel.CallInfo; pass on the one InvokeStream received"
		case st == nil:
			refused = "next was called with a nil kernel.Stream; pass on the stream InvokeStream received, or a wrapper of it"
		}
		if refused != "" {
			c.problems = append(c.problems, refused)
			c.mu.Unlock()
			return kernel.Errorf(kernel.FailedPrecondition, "plugintest: %s", refused)
		}
		c.running++
		c.mu.Unlock()
		err := inner(ctx, info, st)
		c.mu.Lock()
		c.running--
		c.nextErr, c.nextDone = err, true
		close(c.ended)
		c.mu.Unlock()
		return err
	}
}

// report fails t with the problems recorded since the last report.
func (c *streamCall) report(t tb) {
	t.Helper()
	c.mu.Lock()
	fresh := c.problems[c.reported:]
	c.reported = len(c.problems)
	c.mu.Unlock()
	for _, p := range fresh {
		t.Errorf("%s", p)
	}
}

// streamOutcome is what one InvokeStream did.
type streamOutcome struct {
	err      error
	nexts    int
	nextErr  error // what next returned, if it was called and returned
	nextDone bool
	panicked bool
	call     *streamCall
}

// run runs InvokeStream on its own goroutine, so that a filter that
// panics or hangs fails the check instead of the test binary; finished
// is false if it did not return within its patience.
func (e *streamEnv) run(ctx context.Context, call *streamCall, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) (streamOutcome, bool) {
	done := make(chan streamOutcome, 1)
	go func() {
		var o streamOutcome
		defer func() {
			if p := recover(); p != nil {
				o = streamOutcome{panicked: true, err: fmt.Errorf("%v", p)}
			}
			call.mu.Lock()
			call.returned = true
			if call.running > 0 {
				call.problems = append(call.problems, "InvokeStream returned while next was still running: a stream filter "+
					"returns when next does (on the server when the handler has, on the client when the caller is done "+
					"with the stream), with next's outcome")
				// Wait for it, so that the check reads what next wrote
				// after next wrote it.
				call.mu.Unlock()
				select {
				case <-call.ended:
				case <-time.After(e.patience()):
				}
				call.mu.Lock()
			}
			o.nexts, o.nextErr, o.nextDone = call.nexts, call.nextErr, call.nextDone
			call.mu.Unlock()
			o.call = call
			done <- o
		}()
		o.err = e.filter.InvokeStream(ctx, info, st, call.next(next))
	}()
	select {
	case o := <-done:
		return o, true
	case <-time.After(e.patience()):
		return streamOutcome{call: call}, false
	}
}

// invoke runs a stream through the filter and reports what no check may
// accept (see checkOutcome). ok is false when there is nothing further
// to check.
func (e *streamEnv) invoke(t tb, ctx context.Context, call *streamCall, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) (streamOutcome, bool) {
	t.Helper()
	o, finished := e.run(ctx, call, info, st, next)
	switch {
	case !finished:
		t.Errorf("InvokeStream on the %s side did not return within %s", e.side, e.patience())
		return o, false
	case o.panicked:
		t.Errorf("InvokeStream on the %s side panicked: %v", e.side, o.err)
		return o, false
	}
	return o, e.checkOutcome(t, o)
}

// checkOutcome holds a stream's outcome to what the engine can take: a
// refusal is a *kernel.Status and never follows next, a stream that next
// ended with a status does not end OK, and one that next ended OK ends OK
// or with a status of the filter's.
func (e *streamEnv) checkOutcome(t tb, o streamOutcome) bool {
	t.Helper()
	o.call.report(t)
	var st *kernel.Status
	isStatus := errors.As(o.err, &st)
	switch {
	case o.nexts == 0 && o.err == nil:
		t.Errorf("InvokeStream returned nil without calling next: on the client the caller would get no stream, on the " +
			"server the stream would end OK though its handler never ran; call next, or refuse with a *kernel.Status")
		return false
	case o.nexts == 0 && !isStatus:
		t.Errorf("the filter refused the stream with %T %q, not a *kernel.Status; refuse with kernel.Errorf(code, ...) "+
			"so that the other end gets a code", o.err, o.err)
		return false
	case o.nexts == 0:
		return true
	case o.nextErr == nil && o.err != nil && !isStatus:
		t.Errorf("next ended the stream OK, but the filter returned %T %q, not a *kernel.Status; a filter that fails a "+
			"stream must say why with kernel.Errorf(code, ...)", o.err, o.err)
		return false
	case o.nextErr != nil && o.err == nil:
		t.Errorf("next ended the stream with %s, but the filter returned nil: the stream would be reported OK; "+
			"return next's error", filterDescribe(o.nextErr.Error()))
		return false
	case o.nextErr != nil && !errors.Is(o.err, o.nextErr) && !isStatus:
		t.Errorf("next ended the stream with %s, but the filter returned %T %s, which neither is that error nor wraps it, "+
			"nor is a *kernel.Status; return next's error (or wrap it with %%w), or a status of the filter's own",
			filterDescribe(o.nextErr.Error()), o.err, filterDescribe(o.err.Error()))
		return false
	}
	return true
}

// reachedNext reports whether a stream the suite's config should let
// through reached next, failing t if the filter refused it.
func (e *streamEnv) reachedNext(t tb, o streamOutcome) bool {
	t.Helper()
	if o.nexts > 0 {
		return true
	}
	t.Errorf("the filter refused a stream its FilterConfig should let through: %T %q; set FilterConfig.Metadata or "+
		"FilterConfig.Options so that the suite's streams pass (or FilterConfig.RejectsEveryCall, if the filter is meant "+
		"to refuse everything), since what a filter passes on can only be checked on streams it passes", o.err, o.err)
	return false
}

// streamApp is the suite's next on a passing stream: the handler or the
// caller, sending sends messages on a goroutine of its own while it
// receives until the end, as a bidirectional stream's two sides do, and
// checking what it receives is the wire's messages, in order. On the
// client it then does what the engine's next does at the stream's end:
// writes the peer, the attempt and the trailers into info.
func (e *streamEnv) streamApp(call *streamCall, stream string, sends, wantRecv int, trailers kernel.Metadata) kernel.StreamInvoker {
	return func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
		sendErr := make(chan error, 1)
		go func() {
			for i := range sends {
				if err := st.SendMsg(&streamMsg{stream: stream, seq: i}); err != nil {
					sendErr <- fmt.Errorf("sending message %d: %w", i, err)
					return
				}
			}
			sendErr <- nil
		}()
		got, broken := 0, false
		for !broken {
			m := new(streamMsg)
			err := st.RecvMsg(m)
			switch {
			case errors.Is(err, io.EOF):
			case err != nil:
				call.problem(fmt.Sprintf("receiving message %d of %d through the filter: %v", got, wantRecv, err))
				broken = true
			case *m == streamMsg{}:
				call.problem(fmt.Sprintf("message %d received through the filter left the caller's message empty: "+
					"the filter decoded it into a value of its own; pass the caller's m on", got))
				broken = true
			case m.stream != stream || m.seq != got:
				call.problem(fmt.Sprintf("message %d received through the filter is message %d of stream %q "+
					"(want %d of %q): messages must pass through whole and in order", got, m.seq, m.stream, got, stream))
				broken = true
			default:
				got++
				continue
			}
			break
		}
		if !broken && got != wantRecv {
			call.problem(fmt.Sprintf("%d messages were received through the filter before the end, want the %d the stream carried", got, wantRecv))
		}
		if err := <-sendErr; err != nil {
			call.problem(err.Error())
		}
		if e.side == kernel.ClientSide {
			info.Peer, info.Attempt = streamPeer, 1
			info.ResponseMetadata = trailers.Clone() // the engine replaces the map, as the answer's metadata
		}
		return nil
	}
}

// streamPeer is the instance address the suite's client next reports.
const streamPeer = "127.0.0.1:7001"

// checkSent fails t unless the wire received sends messages, in order.
func checkSent(t tb, w *streamWire, sends int) {
	t.Helper()
	got := w.sentSeqs()
	for i, seq := range got {
		if seq != i {
			t.Errorf("message %d sent through the filter reached the stream as message %d: messages must pass through "+
				"whole and in order (sent: %s)", i, seq, streamSeqs(got))
			return
		}
	}
	if len(got) != sends {
		t.Errorf("%d messages sent through the filter reached the stream, want %d", len(got), sends)
	}
}

// streamSeqs prints a run of message numbers, long ones by their ends.
func streamSeqs(seqs []int) string {
	s := ""
	for i, n := range seqs {
		if i > 0 {
			s += ","
		}
		s += strconv.Itoa(n)
	}
	return filterDescribe(s)
}
