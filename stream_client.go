package kernrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// ClientStream is one streaming call from the client's side. SendMsg and
// RecvMsg pass through the client's stream filters. One goroutine may
// send while another receives, but two must not send (or receive) at
// once, nor CloseSend while another sends.
//
// A stream frees itself once RecvMsg has returned its end (io.EOF or the
// final status), and its Context ends then. Close, or cancelling the
// context it was opened with, abandons it: call one of them when you stop
// reading a stream early.
type ClientStream struct {
	core   streamCore
	client *Client
	cc     *clientConn
	info   kernel.CallInfo
	inst   *kernel.Instance
	msgs   kernel.Stream
	ctx    context.Context
	cancel context.CancelFunc
	stop   func() bool // stops watching ctx; set under core.mu

	headerReady chan struct{} // closed once the headers are in
	header      kernel.Metadata
	trailer     kernel.Metadata // set before the stream's end is visible
	over        chan struct{}   // closed once the caller is done with it
	overOnce    sync.Once
	headerOnce  sync.Once
	opened      chan error // with stream filters: the open's outcome
	bound       bool       // the filters' goroutine reached the chain's end
	// answered is set by the typed CloseAndRecv, which returns the one
	// response: a second call must not read the end as a missing one.
	answered atomic.Bool
}

// NewStream opens a stream to method, untyped: OpenStream and
// OpenServerStream are the typed front ends. ctx bounds the whole stream:
// its deadline reaches the server, and cancelling it ends the stream on
// both sides. Metadata attached with WithMetadata goes with the opening.
func (c *Client) NewStream(ctx context.Context, method string, opts ...CallOption) (*ClientStream, error) {
	if c.closed.Load() {
		return nil, c.closedStatus()
	}
	ctx, _, release := applyCallOptions(ctx, opts)
	ctx, cancelCtx := context.WithCancel(ctx)
	cancel := func() { cancelCtx(); release() }
	cs := &ClientStream{client: c, ctx: ctx, cancel: cancel, headerReady: make(chan struct{}), over: make(chan struct{})}
	cs.info = kernel.CallInfo{Method: method, Side: kernel.ClientSide, Codec: c.codec.Name(), Metadata: OutgoingMetadata(ctx).Clone()}
	cs.msgs = clientMsgs{cs}
	filters := c.streamFilters(method)
	if len(filters) == 0 {
		if err := c.openStream(ctx, cs, &cs.info); err != nil {
			cancel()
			return nil, err
		}
		return cs, nil
	}
	cs.opened = make(chan error, 1)
	if !c.trackFiltered(cs) {
		cancel()
		return nil, c.closedStatus()
	}
	go cs.runFilters(streamChain(filters, cs.openFromChain))
	if err := <-cs.opened; err != nil {
		cancel()
		return nil, err
	}
	return cs, nil
}

// streamFilters lists the client's filters that apply to streams of
// method, call stage first.
func (c *Client) streamFilters(method string) []kernel.StreamFilter {
	var fs []kernel.StreamFilter
	if c.callChains != nil {
		fs = filtersAs[kernel.StreamFilter](c.callChains.filters, method)
	}
	if c.attemptChains != nil {
		fs = append(fs, filtersAs[kernel.StreamFilter](c.attemptChains.filters, method)...)
	}
	return fs
}

// runFilters runs the stream filters around the stream's whole life on a
// goroutine of its own: they return once the caller is done with it.
func (cs *ClientStream) runFilters(chain kernel.StreamInvoker) {
	defer cs.client.untrackFiltered(cs)
	err := chain(cs.ctx, &cs.info, clientMsgs{cs})
	// Ended only now, not with the stream: the filters may still use it
	// after next returned. See markOver.
	cs.cancel()
	if !cs.bound {
		if err == nil {
			err = kernel.Errorf(kernel.Internal, "a client stream filter returned without opening the stream of %s or an error; call next, or return a *kernel.Status", cs.info.Method)
		}
		cs.opened <- err
	}
}

// trackFiltered records cs, whose filters are about to run on a goroutine
// of their own, for Close; false once the client is closed.
func (c *Client) trackFiltered(cs *ClientStream) bool {
	c.filteredMu.Lock()
	defer c.filteredMu.Unlock()
	if c.closed.Load() {
		return false
	}
	if c.filtered == nil {
		c.filtered = map[*ClientStream]struct{}{}
	}
	c.filtered[cs] = struct{}{}
	c.filtering.Add(1)
	return true
}

func (c *Client) untrackFiltered(cs *ClientStream) {
	c.filteredMu.Lock()
	delete(c.filtered, cs)
	c.filteredMu.Unlock()
	c.filtering.Done()
}

// filtersGrace bounds Close's wait for stream filters to return once
// their streams ended: one that does not return must not hold Close.
const filtersGrace = 5 * time.Second

// endFilteredStreams ends, at Close, the streams whose filters run on a
// goroutine of their own (their connections are closed by now, so each
// has its end), marks them over so that the chains return, and waits for
// the filters, for at most filtersGrace.
func (c *Client) endFilteredStreams() {
	c.filteredMu.Lock()
	streams := make([]*ClientStream, 0, len(c.filtered))
	for cs := range c.filtered {
		streams = append(streams, cs)
	}
	c.filteredMu.Unlock()
	for _, cs := range streams {
		cs.markOver()
	}
	done := make(chan struct{})
	go func() { c.filtering.Wait(); close(done) }()
	t := time.NewTimer(filtersGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.get().Warn("closing the client's plugins while stream filters still run; a filter's InvokeStream does not return once its stream ended", "streams", len(streams))
	}
}

// openFromChain ends the client's stream filter chain: it opens the
// stream, hands it to the caller, and waits until the caller is done.
func (cs *ClientStream) openFromChain(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
	cs.msgs, cs.bound = st, true
	if err := cs.client.openStream(ctx, cs, info); err != nil {
		cs.opened <- err
		return err
	}
	cs.opened <- nil
	<-cs.over
	info.ResponseMetadata = cs.trailer
	return cs.finalStatus()
}

// openStream picks an instance and opens the stream on one of its
// connections, trying another when the first could not take it.
func (c *Client) openStream(ctx context.Context, cs *ClientStream, info *kernel.CallInfo) error {
	retries := *c.cfg.Client.Retries
	var ready readyWait
	for tries, skipped := 0, 0; ; tries++ {
		if tries >= retries {
			ready.beforePick(c)
		}
		inst, err := c.pick(ctx, nil, info)
		if err != nil {
			return err
		}
		p, err := c.pool(inst.Address)
		if err != nil {
			c.pickDone(inst, err)
			return err
		}
		// Passed over as a call's pick is (attemptLoop).
		if skipped++; skipped <= maxSkippedPicks && p.avoided() {
			c.pickDone(inst, errPassedOver)
			tries--
			continue
		}
		skipped = 0 // counted afresh for the next try
		var cc *clientConn
		if cc, err = p.get(ctx, nil); err == nil {
			err = cc.openStream(ctx, cs, inst, info)
		}
		if err == nil {
			info.Instance, info.Peer, info.Attempt = inst, inst.Address, tries+1
			return nil
		}
		c.pickDone(inst, err)
		if !kernel.IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		if tries >= retries {
			if err := c.awaitReady(ctx, nil, &ready, p.addr, err); err != nil {
				return err
			}
		}
	}
}

// openStream registers cs on cc, an instance of inst, and sends the
// request that opens it.
func (cc *clientConn) openStream(ctx context.Context, cs *ClientStream, inst *kernel.Instance, info *kernel.CallInfo) error {
	c := cs.client
	// A context that ended is not sent: the server would run the handler
	// only to have it cancelled by the Cancel that follows.
	if dl, ok := ctx.Deadline(); ctx.Err() != nil || ok && !time.Now().Before(dl) {
		return c.ctxStatus(ctx, nil, "before the stream of "+info.Method+" was opened")
	}
	cc.mu.Lock()
	if cc.dead != nil || cc.draining {
		cc.mu.Unlock()
		return &kernel.Status{Code: kernel.Unavailable, Message: "connection to " + cc.conn.RemoteAddr() + " is closing; the stream was not opened", Retryable: true}
	}
	if cc.flow == nil {
		cc.flow = newConnFlow(int64(c.cfg.Streams.ConnectionWindow))
		cc.flow.refused = cc.grantRefused
	}
	cc.stopIdleReadLocked()
	cc.nextID++
	id := cc.nextID
	if cc.streams == nil {
		cc.streams = make(map[uint64]*ClientStream)
	}
	cc.streams[id] = cs
	cc.streamsGen.Add(1)
	c.streamsOpen.Add(1)
	// Bound under the core's lock: a connection an earlier attempt was
	// opened on may still be failing, and finish tells by cs.cc and the
	// core's id that the stream has moved on. inst too, before the request
	// goes out: the stream's end may come at once, and tells the balancer
	// about inst.
	cs.core.mu.Lock()
	cs.cc, cs.inst = cc, inst
	cs.core.init(id, cc.conn, cc.flow, c.codec, int64(c.cfg.Streams.Window))
	cs.core.opening, cs.core.lost = true, nil
	cs.core.mu.Unlock()
	cs.core.ctx, cs.core.ctxStatus, cs.core.writeCtl, cs.core.side = ctx, cs.ctxStatus, cc.queueCtl, cs
	cs.core.sent = true // the headers went with the request
	cc.startStreamReaderLocked()
	cc.mu.Unlock()
	c.startIdleSweep()

	req := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: id, Method: info.Method,
		Codec: c.codec.Name(), Metadata: info.Metadata, Credit: uint32(cs.core.recvWin.window)}
	if dl, ok := ctx.Deadline(); ok {
		req.Timeout = max(time.Until(dl), time.Microsecond)
	}
	err := cc.flow.announce(cc.conn.WriteFrame)
	if err == nil {
		err = writeFrame(ctx, cc.conn, req)
	}
	cs.core.mu.Lock()
	lost := cs.core.lost
	if err == nil {
		cs.core.opening = false
	}
	cs.core.mu.Unlock()
	if err != nil {
		// Nothing was sent: the stream is dropped, its core left as it is,
		// since Client.openStream may open it again on another connection.
		// It stays opening: the connection's failure, which may have this
		// stream in hand on its reader, must leave the outcome to us.
		cc.removeStream(id)
		if st := cs.core.writeFailed(err); kernel.StatusOf(st).Code != kernel.Unavailable {
			cc.mu.Lock()
			cc.unsent++ // refused alone: the connection lives on
			cc.mu.Unlock()
			return st
		}
		cc.fail(err)
		return &kernel.Status{Code: kernel.Unavailable, Message: "open a stream on " + cc.conn.RemoteAddr() + ": " + err.Error(), Retryable: true}
	}
	if lost != nil {
		// Sent, then the connection failed: the server may have the
		// stream, so it is not opened again, unless its GoAway said it
		// never was (lost is then retryable: see clientConn.fail).
		cc.removeStream(id)
		return lost
	}
	// Under the core's lock: a ctx that ended meanwhile runs ctxDone at
	// once, on a goroutine of its own, and markOver reads stop.
	stop := context.AfterFunc(ctx, cs.ctxDone)
	cs.core.mu.Lock()
	cs.stop = stop
	cs.core.mu.Unlock()
	return nil
}

// grantRefused fails a connection on which the transport refused a
// WindowUpdate alone (shm-ring: the server read nothing for wait_timeout):
// the server would wait for that credit for good (writeGrant). Its streams
// and calls end at once, Unavailable, instead of hanging.
func (cc *clientConn) grantRefused(id uint64, err error) {
	if cc.conn.Err() != nil {
		return
	}
	cc.log.get().Warn("flow-control credit not sent; closing the connection so that its streams end instead of waiting for it",
		"call_id", id, "peer", cc.conn.RemoteAddr(), "err", err)
	cc.fail(fmt.Errorf("flow-control credit (a WindowUpdate on call id %d) could not be sent: %w", id, err))
}

// queueCtl sends a control frame (or a stream's message) through the
// connection's writer where it has one (queueFrame).
func (cc *clientConn) queueCtl(f *kernel.Frame) error { return queueFrame(cc.conn, f) }

// ctxDone ends a stream whose context ended, telling the server.
func (cs *ClientStream) ctxDone() { cs.endWith(cs.ctxStatus()) }

// endWith ends the stream with err and marks it over, as a Recv that
// returned err as its end would.
func (cs *ClientStream) endWith(err error) {
	cs.abandon(err)
	cs.markOver()
}

// abandon ends the stream here; if the server had not ended it, the
// server is told and the pick ends.
func (cs *ClientStream) abandon(err error) {
	if ended, first := cs.core.endFirst(err); ended && first {
		cs.cc.removeStream(cs.core.id)
		cs.cc.cancel(cs.core.id, cs.endedCtx())
		cs.client.pickDone(cs.inst, err)
	}
}

func (cs *ClientStream) ctxStatus() error {
	return cs.client.ctxStatus(cs.endedCtx(), nil, "while the stream of "+cs.info.Method+" to "+cs.cc.conn.RemoteAddr()+" was open")
}

// endedCtx is the context whose end ends the stream: the one the stream
// was opened with, which stream filters may have derived from the
// caller's (a timeout of their own, or a cancel), once it has ended;
// else the caller's (Close, or a filter that passed on a context of its
// own that has not ended). The caller's is ended only once the filters
// return, after the stream's end: read first, it would say Canceled, or
// a deadline for a cancel.
func (cs *ClientStream) endedCtx() context.Context {
	if ctx := cs.core.ctx; ctx != nil && ctx.Err() != nil {
		return ctx
	}
	return cs.ctx
}

// markOver records that the caller is done with the stream, and ends its
// context: until then the context stays registered with the one the
// stream was opened with (and a Timeout option's timer runs), which a
// long-lived parent would hold on to for every stream that ended.
// With filters, runFilters ends it once they have returned.
func (cs *ClientStream) markOver() {
	cs.overOnce.Do(func() {
		cs.core.mu.Lock()
		stop := cs.stop
		cs.core.mu.Unlock()
		if stop != nil {
			stop()
		}
		if cs.opened == nil {
			cs.cancel()
		}
		close(cs.over)
	})
}

// final takes the server's closing Response, read on cc: the status and
// trailers.
func (cs *ClientStream) final(cc *clientConn, f *kernel.Frame) {
	var st error = io.EOF
	if f.Code != kernel.OK {
		st = &kernel.Status{Code: f.Code, Message: f.Message, Retryable: f.Flags&kernel.FlagRetryable != 0}
	}
	cs.finish(cc, f.CallID, st, f.Metadata)
	f.Release()
}

// lose ends the stream, as opened on cc with id, with the loss of cc. One
// being opened there is left to its opener, which may open it again
// elsewhere if its request was never sent; unless the server's end came
// first, which the stream keeps.
func (cs *ClientStream) lose(cc *clientConn, id uint64, st error) {
	cs.core.mu.Lock()
	if cs.core.opening && cs.cc == cc && cs.core.id == id {
		if cs.core.final == nil {
			cs.core.lost = st // the opener fails the open, or opens it again
		}
		cs.core.mu.Unlock()
		cc.removeStream(id)
		return
	}
	cs.core.mu.Unlock()
	cs.finish(cc, id, st, nil)
}

// finish ends the stream, as opened on cc with id, from the server's side
// (its status, or the connection's loss): messages already received can
// still be read.
func (cs *ClientStream) finish(cc *clientConn, id uint64, st error, trailer kernel.Metadata) {
	cc.removeStream(id)
	cs.core.mu.Lock()
	if cs.cc != cc || cs.core.id != id || cs.core.lost != nil {
		// Opened again elsewhere since, or lost while being opened: the
		// opener has the outcome.
		cs.core.mu.Unlock()
		return
	}
	if cs.core.ended != nil || cs.core.final != nil {
		cs.core.mu.Unlock()
		return
	}
	cs.trailer = trailer
	cs.core.final, cs.core.peerDone = st, true
	cs.core.sendStopped.Store(true)
	inst := cs.inst
	cs.core.mu.Unlock()
	// If no message carried the headers, the server sent them with its
	// status, in the same metadata as the trailers (docs/protocol.md).
	cs.gotHeader(trailer)
	cs.core.wakeSenders() // a sender waiting for credit sees the end
	cs.core.signal()
	var err error
	if st != io.EOF {
		err = st
	}
	cs.client.pickDone(inst, err)
}

// gotHeader records the server's headers, once: from its first message,
// or its final status when it ends the stream first (none if the
// connection was lost).
func (cs *ClientStream) gotHeader(md kernel.Metadata) {
	cs.headerOnce.Do(func() {
		cs.header = md
		close(cs.headerReady)
	})
}

// finalStatus is the stream's outcome for the filters: nil for OK.
func (cs *ClientStream) finalStatus() error {
	cs.core.mu.Lock()
	defer cs.core.mu.Unlock()
	err := cs.core.final
	if err == nil {
		err = cs.core.ended
	}
	if err == io.EOF {
		return nil
	}
	return err
}

// Context is the stream's context.
func (cs *ClientStream) Context() context.Context { return cs.ctx }

// Info describes the stream: method, the instance it went to, metadata.
func (cs *ClientStream) Info() *kernel.CallInfo { return &cs.info }

// SendMsg sends m, waiting while the server has granted no credit (it
// reads slowly) until the stream's context ends. After the server ended
// the stream it returns io.EOF (status OK) or the final status.
func (cs *ClientStream) SendMsg(m any) error { return cs.msgs.SendMsg(m) }

// RecvMsg reads the server's next message into m. At the end it returns
// io.EOF if the server ended the stream with OK, else its status.
func (cs *ClientStream) RecvMsg(m any) error { return cs.msgs.RecvMsg(m) }

// recvNew is RecvMsg into v, a value the caller has just made; without
// stream filters (which would see v) nobody else has seen it, and the
// codec may decode it as fresh.
func (cs *ClientStream) recvNew(v any) error {
	if m, ok := cs.msgs.(clientMsgs); ok {
		return m.recv(v, true)
	}
	return cs.msgs.RecvMsg(v)
}

// CloseSend tells the server no more messages will come; its RecvMsg
// returns io.EOF once it has read them all. If the transport refuses the
// half-close alone (shm-ring: the server read nothing for wait_timeout),
// the stream ends with that status, and the server is told: nothing sends
// the half-close again, and the server's handler would wait for it.
func (cs *ClientStream) CloseSend() error {
	err := cs.core.closeSend()
	var st *kernel.Status
	if err != nil && errors.As(err, &st) && cs.cc.conn.Err() == nil {
		cs.abandon(err)
	}
	return err
}

// Header waits for the server's header metadata, sent with its first
// message or its final status.
func (cs *ClientStream) Header() (kernel.Metadata, error) {
	// Looked at first: a stream that ended has its context ended too, and
	// a select would pick either.
	select {
	case <-cs.headerReady:
		return cs.header, nil
	default:
	}
	select {
	case <-cs.headerReady:
		return cs.header, nil
	case <-cs.ctx.Done():
		return nil, cs.ctxStatus()
	}
}

// Trailer is the metadata the server sent with its final status; nil
// until RecvMsg has returned the stream's end.
func (cs *ClientStream) Trailer() kernel.Metadata {
	select {
	case <-cs.headerReady:
	default:
		return nil
	}
	cs.core.mu.Lock()
	defer cs.core.mu.Unlock()
	if cs.core.final == nil {
		return nil
	}
	return cs.trailer
}

// Close abandons the stream if it is still open (the server's handler
// sees its context cancelled) and frees it. It is idempotent.
func (cs *ClientStream) Close() error {
	cs.cancel()
	cs.ctxDone()
	return nil
}

// clientMsgs is the innermost kernel.Stream of a client: the wire.
type clientMsgs struct{ cs *ClientStream }

func (m clientMsgs) SendMsg(v any) error { return m.cs.core.send(v) }

func (m clientMsgs) RecvMsg(v any) error { return m.recv(v, false) }

func (m clientMsgs) recv(v any, fresh bool) error {
	cs := m.cs
	err := cs.core.recv(v, fresh, cs.core.finalErr)
	if err != nil {
		// The caller has seen the end, or an error that ends the stream
		// here (a message that does not decode): then the server is told.
		cs.abandon(err)
		cs.markOver()
	}
	return err
}

// logCodecPanic logs a codec's panic on one of the stream's messages.
func (cs *ClientStream) logCodecPanic(err error) { logCodecPanic(cs.cc.log.get(), cs.info.Method, err) }
