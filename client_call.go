package kernrpc

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kernrpc/kernrpc/kernel"
)

// callState is one client call, pooled so that a call costs no allocation
// of its own. Where filters run, it is also the context they receive
// (wrapping the caller's), so that the end of each chain finds its call
// however the filters copied the CallInfo; attempts a filter leaves
// running after the call returned keep it alive through refs.
type callState struct {
	context.Context // the caller's, with client.timeout applied

	client *Client
	info   kernel.CallInfo // what the call filters see
	reply  any             // the caller's: the answer lands here
	// given is the deadline the client gave the call, if it gave one
	// (client.timeout, or the filter givenBy names after givenTimeout), so
	// that a deadline error says so; chain holds it in place (see
	// withDeadline), with the timer state dl, which cs keeps across calls.
	given        time.Time
	givenTimeout time.Duration
	givenBy      string
	chain        *chainCtx
	dl           *callDeadline
	// sendGiven says the deadline given in place has not been sent yet
	// (see sentTimeout).
	sendGiven atomic.Bool

	// shared is set when filters run: attempts may then overlap or outlive
	// the call, and mu guards reply, lent, over and info's outcome fields.
	shared   bool
	mu       sync.Mutex
	lent     replyUse
	over     bool // the call has returned its result to the caller
	attempts atomic.Int32
	refs     atomic.Int32
}

// replyUse says who may write into the caller's reply.
type replyUse uint8

const (
	replyFree  replyUse = iota // the next attempt decodes into it
	replyLent                  // an attempt in flight decodes into it
	replyGiven                 // an attempt returned it as its answer: later ones get their own
)

type callStateKey struct{}

func (cs *callState) release() {
	if cs.refs.Add(-1) == 0 {
		c, dl := cs.client, cs.dl
		*cs = callState{dl: dl}
		c.calls.Put(cs)
	}
}

// lendReply returns what an attempt decodes its answer into: the caller's
// reply when no other attempt holds it or returned it, else a new value of
// the same type, so that attempts running at once never share one.
func (cs *callState) lendReply() (reply any, own bool) {
	if !cs.shared {
		return cs.reply, true
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.lent == replyFree && !cs.over {
		cs.lent = replyLent
		return cs.reply, true
	}
	return newLike(cs.reply), false
}

// returnReply ends an attempt's hold on the caller's reply.
func (cs *callState) returnReply(own, answered bool) {
	if !own || !cs.shared {
		return
	}
	cs.mu.Lock()
	if answered {
		cs.lent = replyGiven
	} else {
		cs.lent = replyFree
	}
	cs.mu.Unlock()
}

// errCallOver is what a late attempt gets for decoding into a reply the
// caller already has back.
var errCallOver = kernel.Errorf(kernel.Canceled, "the call returned before this attempt's answer arrived")

// decodeReply decodes an answer into reply. Into the caller's own reply
// only while the call has not returned: a hedge's slower attempt must not
// write into a value the caller is reading.
func (cs *callState) decodeReply(codec kernel.Codec, data []byte, reply any, own bool) error {
	if !own || !cs.shared {
		return unmarshal(codec, data, reply, false)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.over {
		return errCallOver
	}
	return unmarshal(codec, data, reply, false)
}

// newLike returns a new zero value of the type v points to.
func newLike(v any) any {
	// A message made from descriptors (dynamicpb) is only usable made
	// from its own descriptor: its zero value knows no type.
	if m, ok := v.(protoreflect.ProtoMessage); ok {
		return m.ProtoReflect().New().Interface()
	}
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return v
	}
	return reflect.New(t.Elem()).Interface()
}

func (c *Client) call(ctx context.Context, method string, req, resp any) (kernel.Metadata, error) {
	if c.closed.Load() {
		return nil, c.closedStatus()
	}
	cs := c.calls.Get().(*callState)
	cs.client, cs.reply = c, resp
	cs.refs.Store(1)
	info := &cs.info
	info.Method, info.Side, info.Codec = method, kernel.ClientSide, c.codec.Name()
	info.Metadata = OutgoingMetadata(ctx)
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); !ok {
		if d, by := c.givenTimeout(info); d > 0 {
			if ctx.Done() == nil {
				ctx = cs.withDeadline(ctx, d, by)
			} else {
				ctx, cancel = context.WithTimeout(ctx, d)
				cs.given, _ = ctx.Deadline()
				cs.givenTimeout, cs.givenBy = d, by
			}
		}
	}
	if cs.chain != nil {
		cs.Context = cs.chain.Context
	} else {
		cs.Context = ctx
	}
	var out any
	var err error
	switch {
	case c.callChains != nil:
		cs.shared = true
		info.Metadata = callMetadata(info.Metadata) // filters may add to it
		out, err = c.callChains.forMethod(method)(cs.chainContext(), info, req)
	case c.attemptChains != nil:
		cs.shared = true
		out, err = c.attemptLoop(cs.chainContext(), cs, info, req)
	default:
		out, err = c.attemptLoop(ctx, cs, info, req)
	}
	md, err := cs.finish(out, err)
	if cs.chain != nil {
		cs.dl.end(cs.chain, cs.refs.Load() > 1)
	}
	if cancel != nil {
		cancel()
	}
	cs.release()
	return md, err
}

// finish ends the call: from now on no attempt writes into the caller's
// reply, which receives the outermost filter's answer when that is another
// value (from a cache, a fallback, or a hedge's second attempt).
func (cs *callState) finish(out any, err error) (kernel.Metadata, error) {
	if !cs.shared {
		return cs.info.ResponseMetadata, err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.over = true
	md := cs.info.ResponseMetadata
	if err == nil && out == nil {
		return md, kernel.Errorf(kernel.Internal, "a client filter ended %s with neither a response nor an error; return next's response, one of its own, or a *kernel.Status", cs.info.Method)
	}
	if err != nil || sameValue(out, cs.reply) {
		return md, err
	}
	c := cs.client
	merr := copyThrough(c.codec, out, cs.reply)
	if merr != nil {
		logCodecPanic(c.log.get(), cs.info.Method, merr)
		return md, kernel.Errorf(kernel.Internal, "a client filter answered %s with a %T that %s cannot copy into the caller's %T: %v",
			cs.info.Method, out, c.codec.Name(), cs.reply, merr)
	}
	return md, nil
}

// callMetadata is the copy of md that filters, which may add to it, get:
// nil for an empty map, which SetRequestMetadata replaces with one of the
// call's own, rather than writing into one the caller (or the call, for an
// attempt) holds, and that concurrent calls may share.
func callMetadata(md kernel.Metadata) kernel.Metadata {
	if len(md) == 0 {
		return nil
	}
	return md.Clone()
}

// sameValue reports whether a and b are the same value; a value whose type
// cannot be compared is not the caller's reply (a pointer).
func sameValue(a, b any) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// callFrom finds the call a chain runs for.
func (c *Client) callFrom(ctx context.Context) (*callState, error) {
	cs, _ := ctx.Value(callStateKey{}).(*callState)
	if cs == nil || cs.client != c {
		return nil, kernel.Errorf(kernel.Internal, "a client filter called next with a context that does not come from the call; "+
			"pass on the ctx the filter received, or one derived from it")
	}
	return cs, nil
}

// attemptFromChain is the end of the call stage: each call of it is an
// attempt of its own.
func (c *Client) attemptFromChain(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
	cs, err := c.callFrom(ctx)
	if err != nil {
		return nil, err
	}
	cs.refs.Add(1)
	defer cs.release()
	return c.attemptLoop(ctx, cs, info, req)
}

// sendFromChain is the end of the attempt stage.
func (c *Client) sendFromChain(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
	cs, err := c.callFrom(ctx)
	if err != nil {
		return nil, err
	}
	if info.Instance == nil {
		return nil, kernel.Errorf(kernel.Internal, "an attempt filter passed on a CallInfo without the picked Instance")
	}
	return c.send(ctx, cs, nil, nil, info, req)
}

const (
	maxSkippedPicks = 8 // picks of avoided instances passed over per attempt
	maxRefusedPicks = 8 // instances attempt filters may refuse per call of next
	dialAvoidance   = time.Second
	goAwayAvoidance = 5 * time.Second
)

// attemptLoop picks an instance, runs the attempt filters and sends. A
// call the server did not process (it was shutting down, or could not be
// reached) is sent again to a fresh pick, up to client.retries times, and
// then, if it waits for readiness, after pauses until its deadline; an
// instance an attempt filter refused is replaced by another pick.
func (c *Client) attemptLoop(ctx context.Context, cs *callState, info *kernel.CallInfo, req any) (any, error) {
	retries := *c.cfg.Client.Retries
	var refusal error
	var ready readyWait
	for tries, skipped, refused := 0, 0, 0; ; {
		if tries >= retries {
			ready.beforePick(c)
		}
		inst, err := c.pick(ctx, cs, info)
		if err != nil {
			cs.noteNoAttempt(ctx, info)
			return nil, err
		}
		p, err := c.pool(inst.Address)
		if err != nil {
			c.pickDone(inst, err)
			cs.noteNoAttempt(ctx, info)
			return nil, err
		}
		// An instance that refused a dial or said GoAway moments ago is
		// passed over while the balancer offers others.
		if skipped++; skipped <= maxSkippedPicks && p.avoided() {
			c.pickDone(inst, errPassedOver)
			continue
		}
		skipped = 0 // the passes are counted afresh for the next attempt
		at := c.attempts.Get().(*attempt)
		ai := &at.info
		cs.copyInfo(ai, info)
		ai.Instance, ai.Peer, ai.Attempt = inst, inst.Address, int(cs.attempts.Add(1))
		var resp any
		if c.attemptChains != nil {
			resp, err = c.runAttemptFilters(ctx, inst, ai, req)
		} else {
			resp, err = c.send(ctx, cs, at, p, ai, req)
		}
		c.pickDone(inst, err)
		if cs.reportsFor(ctx) {
			cs.noteAttempt(info, ai)
		} else {
			cs.noteNumber(info, ai.Attempt)
		}
		c.putAttempt(at)
		if errors.Is(err, kernel.ErrInstanceRefused) {
			refusal = err // the last one, which the error below quotes
			if refused++; refused < maxRefusedPicks && ctx.Err() == nil {
				continue
			}
			return nil, &kernel.Status{Code: kernel.Unavailable, Retryable: true,
				Message: fmt.Sprintf("no instance of %q took %s: attempt filters refused %d picks (last: %v)", c.service, info.Method, refused, refusal)}
		}
		if err == nil || !kernel.IsRetryable(err) || ctx.Err() != nil {
			return resp, err
		}
		if tries < retries {
			tries++
			c.log.get().Debug("retrying a call the server did not process", "method", info.Method, "instance", inst.Address, "err", err)
			continue
		}
		if err := c.awaitReady(ctx, cs, &ready, p.addr, err); err != nil {
			return nil, err
		}
	}
}

// runAttemptFilters runs the attempt filters for the attempt on inst. One
// that panics still ends the pick, before the panic goes on up to a
// recover filter in the call stage: a balancer counting the calls in
// flight on each instance (least-load) would otherwise count this one
// there for ever.
func (c *Client) runAttemptFilters(ctx context.Context, inst *kernel.Instance, ai *kernel.CallInfo, req any) (resp any, err error) {
	returned := false
	defer func() {
		if !returned {
			c.pickDone(inst, errAttemptPanicked)
		}
	}()
	ai.Metadata = callMetadata(ai.Metadata) // attempt filters may add to it
	resp, err = c.attemptChains.forMethod(ai.Method)(ctx, ai, req)
	returned = true
	return resp, err
}

// errAttemptPanicked ends, for the balancer, a pick whose attempt filters
// panicked.
var errAttemptPanicked = kernel.Errorf(kernel.Internal, "an attempt filter panicked")

// errPassedOver ends, for the balancer, a pick the client did not use: the
// instance refused a dial or sent a GoAway moments ago. It wraps
// ErrInstanceRefused, so that load-aware balancers take no latency from it.
var errPassedOver = fmt.Errorf("kernrpc: instance passed over (it refused a dial or sent a GoAway moments ago): %w", kernel.ErrInstanceRefused)

// pickDone tells a balancer that watches its picks how one ended: every
// pick Pick returned is ended exactly once.
func (c *Client) pickDone(inst *kernel.Instance, err error) {
	if obs, ok := c.balancer.(kernel.PickObserver); ok {
		obs.Done(inst, err)
	}
}

// copyInfo starts an attempt's info from the one next was given, which a
// hedge may share between attempts that write their outcome into it.
func (cs *callState) copyInfo(ai, info *kernel.CallInfo) {
	if cs.shared {
		cs.mu.Lock()
		defer cs.mu.Unlock()
	}
	*ai = *info
	ai.ResponseMetadata, ai.ResponseSize = nil, 0
}

// reportsFor reports whether an attempt made under ctx tells the info
// next was given what became of it. An attempt whose context was canceled
// while the call's was not (a hedge's loser) has no answer to report, and
// must not overwrite the winner's. One whose context ended with the
// call's (its deadline passed, its caller gave up), or at a deadline of
// its own (a filter's per-try timeout), is the last of whatever called
// next: an earlier attempt's answer, if any, is not the call's. The
// call's own context in place ends only with the call, which noteAttempt
// sees, or at its deadline: asking its Err would read the clock for
// nothing.
func (cs *callState) reportsFor(ctx context.Context) bool {
	if ctx == context.Context(cs.chain) {
		return true
	}
	if err := ctx.Err(); err == nil || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if cs.chain != nil {
		return cs.chain.Err() != nil
	}
	return cs.Context.Err() != nil
}

// noteNoAttempt tells the info a call of next that made no attempt (no
// instance could be picked) that it got no answer: the response metadata
// and size an earlier attempt left there are not the call's.
func (cs *callState) noteNoAttempt(ctx context.Context, info *kernel.CallInfo) {
	if !cs.reportsFor(ctx) {
		return
	}
	if cs.shared {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.over {
			return
		}
	}
	info.ResponseMetadata, info.ResponseSize = nil, 0
}

// noteAttempt tells the info an attempt started from what became of it.
func (cs *callState) noteAttempt(info, ai *kernel.CallInfo) {
	if cs.shared {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.over {
			return
		}
	}
	info.Instance, info.Peer, info.Attempt, info.ResponseMetadata = ai.Instance, ai.Peer, ai.Attempt, ai.ResponseMetadata
	info.RequestSize, info.ResponseSize = ai.RequestSize, ai.ResponseSize
}

// noteNumber tells the info of an attempt that has no answer to report
// (a hedge's loser) its number all the same: it was made, and the filter
// that called next counts the call's attempts from the numbers.
func (cs *callState) noteNumber(info *kernel.CallInfo, n int) {
	if cs.shared {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.over {
			return
		}
	}
	info.Attempt = max(info.Attempt, n)
}

func (c *Client) putAttempt(at *attempt) {
	at.info = kernel.CallInfo{}
	c.attempts.Put(at)
}

// send makes one attempt on the instance info names, with at's bookkeeping
// and p's connections (nil: its own, and the instance's).
func (c *Client) send(ctx context.Context, cs *callState, at *attempt, p *connPool, info *kernel.CallInfo, req any) (any, error) {
	var err error
	if p == nil {
		if p, err = c.pool(info.Instance.Address); err != nil {
			return nil, err
		}
	}
	if at == nil {
		at = c.attempts.Get().(*attempt)
		defer c.putAttempt(at)
	}
	reply, own := cs.lendReply()
	var cc *clientConn
	if cc, err = p.get(ctx, cs); err == nil {
		err = cc.roundTrip(ctx, c, cs, at, info, req, reply, own)
	}
	cs.returnReply(own, err == nil)
	if err != nil {
		return nil, err
	}
	return reply, nil
}

// pick asks the balancer for an instance. While there is none, the call
// waits for the registry's next report, up to its deadline (or
// dial_timeout without one) or until the client closes: a client made
// just before its server has registered then finds it.
func (c *Client) pick(ctx context.Context, cs *callState, info *kernel.CallInfo) (*kernel.Instance, error) {
	var timeout <-chan time.Time
	for {
		updated := *c.updated.Load()
		inst, err := c.balancer.Pick(ctx, info)
		if err == nil {
			return inst, nil
		}
		if !errors.Is(err, kernel.ErrNoInstances) {
			// The balancer's own code stands (consistent-hash's
			// InvalidArgument for a call without its key); other errors
			// mean no instance could be had.
			code := kernel.Unavailable
			var st *kernel.Status
			if errors.As(err, &st) {
				code = st.Code
			}
			return nil, kernel.Errorf(code, "pick an instance of %q for %s with balancer %q: %v", c.service, info.Method, c.cfg.Balancer.Name, err)
		}
		if timeout == nil {
			if _, ok := ctx.Deadline(); !ok {
				t := time.NewTimer(c.dialTimeout)
				defer t.Stop()
				timeout = t.C
			}
		}
		select {
		case <-updated:
			continue
		case <-ctx.Done():
		case <-timeout:
		case <-c.life.Done():
			// No report comes to a closed client: the call ends now, as
			// one waiting for a dial or for readiness does.
			return nil, c.closedStatus()
		}
		return nil, &kernel.Status{Code: kernel.Unavailable, Retryable: true, Message: fmt.Sprintf(
			"no instance of %q to call %s: registry %q reported none %s; check that a server of %q is running and registers in the same registry (%s)",
			c.service, info.Method, c.cfg.Registry.Name, c.waitedFor(ctx, cs), c.service, sourceOr(c.cfg.Source))}
	}
}

// waitedFor says how long a call waited, and for which deadline.
func (c *Client) waitedFor(ctx context.Context, cs *callState) string {
	if ctx.Err() == nil {
		return fmt.Sprintf("within client.dial_timeout (%s)", c.cfg.Client.DialTimeout)
	}
	return "before " + c.deadlineName(ctx, cs)
}

// deadlineName says which deadline a call ran out of.
func (c *Client) deadlineName(ctx context.Context, cs *callState) string {
	dl, ok := ctx.Deadline()
	switch {
	case !ok:
		return "the call was canceled"
	case cs != nil && !cs.given.IsZero() && dl.Equal(cs.given) && cs.givenBy == "":
		return fmt.Sprintf("the call's deadline from client.timeout (%s in %s) passed", c.cfg.Client.Timeout, sourceOr(c.cfg.Source))
	case cs != nil && !cs.given.IsZero() && dl.Equal(cs.given):
		return fmt.Sprintf("the %s deadline the %s filter gave the call (the caller set none) passed", cs.givenTimeout, cs.givenBy)
	default:
		return "the deadline of the call's context passed"
	}
}

// ctxStatus is the status of a call whose context ended during stage.
func (c *Client) ctxStatus(ctx context.Context, cs *callState, stage string) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return kernel.Errorf(kernel.Canceled, "canceled by the caller (or a filter) %s", stage)
	}
	return kernel.Errorf(kernel.DeadlineExceeded, "%s %s", c.deadlineName(ctx, cs), stage)
}
