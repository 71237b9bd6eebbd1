package kernrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// streamMethod is a registered streaming method.
type streamMethod struct {
	kind    kernel.StreamKind
	handler func(ctx context.Context, st *ServerStream) error
	invoke  kernel.StreamInvoker // the stream filters around handler, built at Start
}

// ServerStream is one streaming call as its handler sees it. SendMsg and
// RecvMsg pass through the server's stream filters; one goroutine may send
// while another receives, but two must not send (or receive) at once.
type ServerStream struct {
	core   streamCore
	c      *callCtx
	method *streamMethod
	msgs   kernel.Stream // the filters' view, which the handler's calls go through
	ran    bool          // the chain reached the handler (only its goroutine touches it)
}

// RegisterStream adds a streaming handler for method, without generics:
// HandleServerStream, HandleClientStream and HandleBidiStream are the
// typed front ends. Register every method before Start.
func (s *Server) RegisterStream(method string, kind kernel.StreamKind, handler func(ctx context.Context, st *ServerStream) error) error {
	if kind < kernel.ClientStreaming || kind > kernel.BidiStreaming {
		return fmt.Errorf("kernrpc: RegisterStream %q: unknown stream kind %d", method, kind)
	}
	return s.register(method, &methodDesc{stream: &streamMethod{kind: kind, handler: handler}})
}

// Context is the stream's context: cancelled when the client cancels, the
// deadline it sent passes, the connection dies, or the server shuts down.
// A stream filter may have derived the one the handler was given from it.
func (ss *ServerStream) Context() context.Context { return ss.c }

// Info describes the stream: method, peer, codec, the client's metadata.
func (ss *ServerStream) Info() *kernel.CallInfo { return &ss.c.info }

// SendMsg sends m to the client, waiting while the client has granted no
// credit (it reads slowly) until the stream's context ends.
func (ss *ServerStream) SendMsg(m any) error { return ss.msgs.SendMsg(m) }

// RecvMsg reads the client's next message into m; io.EOF means the client
// has closed its side (CloseSend) and every message was read.
func (ss *ServerStream) RecvMsg(m any) error { return ss.msgs.RecvMsg(m) }

// SetHeader adds metadata that goes to the client with the first message
// that goes out (or, if none does, with the final status): a message the
// transport refused alone leaves them to the next.
func (ss *ServerStream) SetHeader(md kernel.Metadata) {
	if ss.core.header == nil {
		ss.core.header = make(kernel.Metadata, len(md))
	}
	for k, v := range md {
		ss.core.header[k] = v
	}
}

// SetTrailer adds metadata that goes to the client with the final status.
// A stream that a shutdown ends while its handler runs gets its status
// without them: the handler may still be setting them.
func (ss *ServerStream) SetTrailer(md kernel.Metadata) {
	for k, v := range md {
		ss.c.info.SetResponseMetadata(k, v)
	}
}

// serverMsgs is the innermost kernel.Stream: the wire.
type serverMsgs struct{ ss *ServerStream }

func (m serverMsgs) SendMsg(v any) error { return m.ss.core.send(v) }
func (m serverMsgs) RecvMsg(v any) error { return m.ss.core.recv(v, false, eof) }

// recvNew is ClientStream.recvNew on the server.
func (ss *ServerStream) recvNew(v any) error {
	if _, ok := ss.msgs.(serverMsgs); ok {
		return ss.core.recv(v, true, eof)
	}
	return ss.msgs.RecvMsg(v)
}

type serverStreamKey struct{}

// streamTerminal ends the server's stream filter chain: the handler.
func streamTerminal(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
	ss, _ := ctx.Value(serverStreamKey{}).(*ServerStream)
	if ss == nil {
		return kernel.Errorf(kernel.Internal, "a stream filter called next with a context that does not come from the stream; pass on the ctx it received, or one derived from it")
	}
	ss.msgs, ss.ran = st, true
	return ss.method.handler(ctx, ss)
}

// openStream answers a Request that opens a stream (or names a streaming
// method): it refuses it, or starts the handler on a goroutine of its own.
// It runs on the read loop and never blocks.
func (sc *serverConn) openStream(c *callCtx, f *kernel.Frame, desc *methodDesc) {
	defer f.Release()
	s := sc.srv
	c.info.Method, c.info.Side, c.info.Peer, c.info.Metadata = f.Method, kernel.ServerSide, sc.conn.RemoteAddr(), f.Metadata
	codec := s.codec
	var err error
	if f.Codec != "" && f.Codec != codec.Name() {
		codec, err = s.codecFor(f.Codec)
	}
	switch {
	case err != nil:
	case c.refused:
		err = &kernel.Status{Code: kernel.Unavailable, Message: "server is shutting down; the stream was not opened, open it elsewhere", Retryable: true}
	case desc == nil:
		err = kernel.Errorf(kernel.Unimplemented, "method %q is not served here (service %q serves %s)", f.Method, s.cfg.Service, s.methodList())
	case desc.stream == nil:
		err = kernel.Errorf(kernel.Unimplemented, "%s is a unary method; call it with Call, not as a stream", f.Method)
	case f.Flags&kernel.FlagStream == 0:
		err = kernel.Errorf(kernel.Unimplemented, "%s is a %s method; open a stream to call it", f.Method, desc.stream.kind)
	case f.Credit == 0:
		err = kernel.Errorf(kernel.InvalidArgument, "the request opening a stream of %s grants no credit (protocol: its credit field is the client's stream window)", f.Method)
	}
	if err != nil {
		sc.answerStream(c, err)
		sc.end(c)
		return
	}
	c.info.Codec = codec.Name()
	ss := &ServerStream{c: c, method: desc.stream}
	ss.msgs = serverMsgs{ss}
	flow := sc.connFlow()
	ss.core.init(c.id, sc.conn, flow, codec, s.streamWindow())
	ss.core.ctx, ss.core.ctxStatus, ss.core.writeCtl, ss.core.side = c, ss.ctxStatus, sc.send, ss
	ss.core.sendWin.announce(int64(f.Credit))
	// Its filters and handler will run: its status can no longer promise
	// it unprocessed. Set before sc.mu publishes the stream to a
	// shutdown's abort, which reads it too.
	c.handled = true
	sc.mu.Lock()
	c.stream = ss
	sc.mu.Unlock()
	if f.Timeout > 0 {
		// Timed at once, unlike a unary call's: a stream whose handler is
		// busy elsewhere must still end at its deadline. Under mu, which
		// Done takes to see whether the timer runs.
		c.mu.Lock()
		c.deadline = deadlineIn(f.Timeout)
		c.timer = time.AfterFunc(f.Timeout, c.expire)
		c.mu.Unlock()
	}
	err = flow.announce(sc.send)
	if err == nil {
		err = sc.send(&kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: c.id, Credit: uint32(ss.core.recvWin.window)})
	}
	if err != nil {
		// The client sends nothing on the stream before it has both
		// windows: refused alone, the connection is closed (writeGrant).
		flow.grantFailed(c.id, err)
	}
	go sc.runStream(ss)
}

// connFlow returns the connection's flow control, made by the first
// stream frame; only the reading goroutine calls it.
func (sc *serverConn) connFlow() *connFlow {
	if sc.flow == nil {
		sc.flow = newConnFlow(sc.srv.connWindow())
		sc.flow.refused = sc.grantRefused
	}
	return sc.flow
}

// grantRefused closes a connection on which the transport refused a
// WindowUpdate alone (shm-ring: the client read nothing for wait_timeout):
// the client would wait for that credit for good (writeGrant). Its streams
// and calls fail at once, Unavailable, as when an answer is refused for
// want of room (closeUnanswered).
func (sc *serverConn) grantRefused(id uint64, err error) {
	if sc.conn.Err() != nil {
		return
	}
	sc.srv.log.Warn("flow-control credit not sent; closing the connection so that its streams end instead of waiting for it",
		"call_id", id, "peer", sc.conn.RemoteAddr(), "err", err)
	_ = sc.conn.Close()
}

// send writes f without waiting on the peer where the transport allows
// it (queueFrame): the read loop sends control frames and refusals.
func (sc *serverConn) send(f *kernel.Frame) error { return queueFrame(sc.conn, f) }

// answerStream ends a stream (or refuses to open one) with err's status
// and the trailers the handler set. Only the goroutine that ran the
// handler, once it returned, or the read loop, before it started, may
// call it: the trailers are the handler's until then.
func (sc *serverConn) answerStream(c *callCtx, err error) {
	sc.answerStreamWith(c, err, c.info.ResponseMetadata)
}

// answerStreamWith is answerStream with the trailers md.
func (sc *serverConn) answerStreamWith(c *callCtx, err error, md kernel.Metadata) {
	out := &kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: c.id}
	if err != nil {
		setStatus(out, c, err, "the stream of "+c.info.Method)
	}
	out.Metadata = md
	code := out.Code
	if err := sc.send(out); err != nil {
		// As a unary answer: refused alone, the client gets the reason
		// (or loses the connection), not a stream that never ends.
		code = kernel.Unavailable // the connection is closed
		if sent := sc.answerRefused(c, sc.send, err); sent != nil {
			code = sent.Code
		}
	}
	if cn := sc.srv.console; cn != nil {
		cn.recordStream(c, code)
	}
}

// streamData hands a StreamData frame to its stream, on the read loop.
func (sc *serverConn) streamData(f *kernel.Frame) {
	id := f.CallID // for the logs: f is released before they are written
	sc.mu.Lock()
	var ss *ServerStream
	if c := sc.calls[id]; c != nil {
		ss = c.stream
	}
	sc.mu.Unlock()
	if f.Flags&kernel.FlagEndStream != 0 {
		f.Release()
		if ss != nil {
			ss.core.peerFinished()
		}
		return
	}
	cost := kernel.StreamCost(len(f.Payload))
	flow := sc.connFlow()
	if !flow.wasAnnounced() {
		// No stream was ever opened here, so no credit was ever granted:
		// data no stream asked for. Granting its credit back would send a
		// WindowUpdate on call id 0 before the announcement, which the
		// client would take for the window.
		f.Release()
		sc.srv.log.Warn("closing a connection whose client sent stream data no stream asked for",
			"call_id", id, "peer", sc.conn.RemoteAddr())
		_ = sc.conn.Close()
		return
	}
	ok := flow.accept(cost)
	switch {
	case ok && ss == nil:
		// A stream that ended here meanwhile: what it carried is read by
		// nobody, and the connection's credit comes back at once.
		f.Release()
		flow.consumed(cost, sc.send)
		return
	case ok:
		ok = ss.core.deliver(f)
	default:
		f.Release()
	}
	if !ok {
		sc.srv.log.Warn("closing a connection whose client sent stream data beyond the credit it was granted",
			"call_id", id, "peer", sc.conn.RemoteAddr())
		_ = sc.conn.Close()
	}
}

// windowUpdate grants credit to the connection (call id 0) or a stream.
func (sc *serverConn) windowUpdate(f *kernel.Frame) {
	if f.CallID == 0 {
		sc.connFlow().send.announce(int64(f.Credit))
		return
	}
	sc.mu.Lock()
	var ss *ServerStream
	if c := sc.calls[f.CallID]; c != nil {
		ss = c.stream
	}
	sc.mu.Unlock()
	if ss != nil {
		ss.core.sendWin.announce(int64(f.Credit))
	}
}

// runStream runs a stream's filters and handler, then sends its status.
func (sc *serverConn) runStream(ss *ServerStream) {
	c := ss.c
	sc.srv.streamsTotal.Add(1)
	sc.srv.streamsOpen.Add(1)
	defer sc.srv.streamsOpen.Add(-1)
	defer sc.end(c)
	err := sc.invokeStream(ss)
	if ss.core.end(errStreamOver) {
		if len(ss.core.header) > 0 && !ss.core.sent {
			ss.SetTrailer(ss.core.header)
		}
		sc.answerStream(c, err)
	}
}

// errStreamOver is what a handler's late SendMsg or RecvMsg returns.
var errStreamOver = kernel.Errorf(kernel.FailedPrecondition, "the stream is over: its handler returned")

func (sc *serverConn) invokeStream(ss *ServerStream) (err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.srv.log.Error("stream handler panicked", "method", ss.c.info.Method, "panic", r, "stack", string(debug.Stack()))
			err = kernel.Errorf(kernel.Internal, "handler for stream %s panicked: %v", ss.c.info.Method, r)
		}
	}()
	if err = ss.method.invoke(ss.c, &ss.c.info, serverMsgs{ss}); err == nil && !ss.ran {
		err = kernel.Errorf(kernel.Internal, "a server stream filter returned without running the handler of %s or refusing the stream; call next, or return a *kernel.Status", ss.c.info.Method)
	}
	return err
}

// abort ends a stream the server will not wait for any longer: the client
// gets st at once, and the handler's context is cancelled.
func (ss *ServerStream) abort(sc *serverConn, st *kernel.Status) {
	if ss.core.end(st) {
		// The handler still runs, and may be setting its trailers on its
		// own goroutine: the status goes without them.
		sc.answerStreamWith(ss.c, st, nil)
	}
	ss.c.cancel(errServerShutdown)
}

// errServerShutdown cancels the streams a shutdown ended.
var errServerShutdown = errors.New("the server shut down")

// ctxStatus is the status a wait of the handler returns once the stream's
// context has ended.
func (ss *ServerStream) ctxStatus() error {
	switch err := ss.c.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return kernel.Errorf(kernel.DeadlineExceeded, "the deadline the client sent for the stream of %s passed", ss.c.info.Method)
	case errors.Is(err, errServerShutdown):
		return kernel.Errorf(kernel.Unavailable, "the server shut down before the stream of %s ended", ss.c.info.Method)
	default:
		return kernel.Errorf(kernel.Canceled, "the client canceled the stream of %s, or its connection closed", ss.c.info.Method)
	}
}

// abortStreams ends every stream still open once a shutdown stopped
// waiting for them.
func (s *Server) abortStreams(why string) int {
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	n := 0
	for _, sc := range conns {
		sc.mu.Lock()
		var open []*ServerStream
		for _, c := range sc.calls {
			if c.stream != nil {
				open = append(open, c.stream)
			}
		}
		sc.mu.Unlock()
		for _, ss := range open {
			ss.abort(sc, &kernel.Status{Code: kernel.Unavailable, Message: "the server shut down before the stream of " + ss.c.info.Method + " ended (" + why + ")"})
			n++
		}
	}
	return n
}

func (s *Server) streamWindow() int64 { return int64(s.cfg.Streams.Window) }
func (s *Server) connWindow() int64   { return int64(s.cfg.Streams.ConnectionWindow) }

func eof() error { return io.EOF }

// logCodecPanic logs a codec's panic on one of the stream's messages.
func (ss *ServerStream) logCodecPanic(err error) { ss.c.sc.logCodecPanic(ss.c.info.Method, err) }
