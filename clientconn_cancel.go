package kernrpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/kernrpc/kernrpc/kernel"
)

// cancel tells the server that the caller gave up call or stream id. A
// Cancel the transport refuses alone (shm-ring: the server read nothing
// for wait_timeout) is not sent again, and the server would run the
// handler on, a stream's for good (it waits for messages or credit that
// will not come), holding one of its max_concurrent_calls: the connection
// is closed instead, which ends every call and stream on it on both sides
// (Unavailable on the client). A caller whose context ended does not wait
// for room for its Cancel (kernel.ContextWriter: shm-ring's full ring):
// one that finds none at once waits on a goroutine of its own, so that the
// caller returns at its deadline.
func (cc *clientConn) cancel(id uint64, ctx context.Context) {
	f := cancelFrame(id, ctx)
	if w, ok := cc.conn.(kernel.ContextWriter); ok && ctx.Err() != nil {
		err := w.WriteFrameContext(ctx, f)
		if code := kernel.CodeOf(err); err != nil && cc.conn.Err() == nil && (code == kernel.Canceled || code == kernel.DeadlineExceeded) {
			go func() { cc.cancelSent(f, cc.conn.WriteFrame(f)) }()
			return
		}
		cc.cancelSent(f, err)
		return
	}
	cc.cancelSent(f, cc.conn.WriteFrame(f))
}

// cancelSent closes the connection when the transport refused Cancel f
// alone, with the connection alive.
func (cc *clientConn) cancelSent(f *kernel.Frame, err error) {
	var st *kernel.Status
	if err == nil || !errors.As(err, &st) || cc.conn.Err() != nil {
		return
	}
	cc.log.get().Warn("cancel not sent; closing the connection so that the server stops the call",
		"call_id", f.CallID, "peer", cc.conn.RemoteAddr(), "err", err)
	cc.fail(fmt.Errorf("the Cancel of call id %d could not be sent: %w", f.CallID, err))
}

// cancelFrame tells the server a call or stream was given up, and why: a
// deadline that passed reads as DeadlineExceeded there too, whichever of
// the Cancel and the server's own copy of the deadline comes first.
func cancelFrame(id uint64, ctx context.Context) *kernel.Frame {
	f := &kernel.Frame{Type: kernel.FrameCancel, CallID: id}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		f.Code = kernel.DeadlineExceeded
	}
	return f
}
