package kernrpc

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
)

// startStreamReaderLocked makes sure a goroutine reads for the
// connection's streams; cc.mu is held.
func (cc *clientConn) startStreamReaderLocked() {
	if cc.srCtx == nil || cc.srCtx.Err() != nil {
		cc.srCtx, cc.srCancel = context.WithCancel(context.Background())
	}
	if !cc.srRunning {
		cc.srRunning = true
		go cc.streamReader()
	}
}

// streamReader takes the reader role whenever it is free, for as long as
// streams are open: a stream's messages and credit must be read even
// when no caller waits on the connection. Callers waiting for answers
// still take turns with it, so unary calls keep their lone-caller path
// once the streams are gone.
func (cc *clientConn) streamReader() {
	me := &attempt{wake: make(chan struct{}, 1)}
	cc.mu.Lock()
	for {
		if len(cc.streams) == 0 || cc.dead != nil {
			cc.srRunning = false
			cc.leaveLocked(me)
			cc.mu.Unlock()
			return
		}
		ctx := cc.srCtx
		if cc.reader == nil || cc.reader == me {
			cc.waiters.remove(me)
			cc.reader = me
			cc.mu.Unlock()
			cc.readFor(ctx, me)
			cc.mu.Lock()
			continue
		}
		if !me.queued {
			cc.waiters.push(me)
		}
		cc.mu.Unlock()
		select {
		case <-me.wake:
		case <-ctx.Done():
		}
		cc.mu.Lock()
	}
}

// removeStream forgets a stream that ended.
func (cc *clientConn) removeStream(id uint64) {
	cc.mu.Lock()
	if _, ok := cc.streams[id]; ok {
		delete(cc.streams, id)
		cc.streamsGen.Add(1)
		cc.pool.client.streamsOpen.Add(-1)
		if len(cc.streams) == 0 && cc.srCancel != nil {
			cc.srCancel()
		}
		cc.closeIfIdleLocked()
	}
	cc.mu.Unlock()
}

// streamData hands a StreamData frame to its stream, on the reader. An
// error means the server broke the protocol.
func (cc *clientConn) streamData(f *kernel.Frame, last *lastStream) error {
	cs, flow := last.lookup(cc, f.CallID)
	if f.Flags&kernel.FlagEndStream != 0 || flow == nil {
		// A server ends its side with the final Response; and stream data
		// on a connection that never opened a stream has no window.
		f.Release()
		if flow == nil {
			return errUnaskedStreamData
		}
		return nil
	}
	cost := kernel.StreamCost(len(f.Payload))
	if !flow.accept(cost) {
		f.Release()
		return errBeyondCredit
	}
	if cs == nil {
		f.Release()
		flow.consumed(cost, cc.queueCtl)
		return nil
	}
	cs.gotHeader(f.Metadata)
	if !cs.core.deliver(f) {
		return errBeyondCredit
	}
	return nil
}

// lastStream is a reader's memory of the stream its last StreamData went
// to: a stream's messages come in runs, and each found its stream under
// the connection's lock, which every call and stream on it takes. It
// lives in one turn at reading (readFor), so it keeps no stream after.
type lastStream struct {
	cs   *ClientStream
	flow *connFlow
	gen  uint64 // cc.streamsGen when cs was looked up
}

// lookup finds stream id and the connection's flow control as cc.mu
// shows them; the last answer stands while no stream has been opened or
// removed since.
func (l *lastStream) lookup(cc *clientConn, id uint64) (*ClientStream, *connFlow) {
	if l.cs != nil && l.cs.core.id == id && l.gen == cc.streamsGen.Load() {
		return l.cs, l.flow
	}
	cc.mu.Lock()
	cs, flow := cc.streams[id], cc.flow
	l.gen = cc.streamsGen.Load()
	cc.mu.Unlock()
	l.cs, l.flow = cs, flow
	return cs, flow
}

var (
	errBeyondCredit      = kernel.Errorf(kernel.Internal, "the server sent stream data beyond the credit it was granted")
	errUnaskedStreamData = kernel.Errorf(kernel.Internal, "the server sent stream data on a connection with no stream")
)

// windowUpdate grants credit to the connection (call id 0) or a stream.
func (cc *clientConn) windowUpdate(f *kernel.Frame) {
	cc.mu.Lock()
	cs := cc.streams[f.CallID]
	flow := cc.flow
	cc.mu.Unlock()
	switch {
	case f.CallID == 0 && flow != nil:
		flow.send.announce(int64(f.Credit))
	case cs != nil:
		cs.core.sendWin.announce(int64(f.Credit))
	}
	f.Release()
}
