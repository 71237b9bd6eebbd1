package kernrpc

import (
	"context"
	"errors"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// codecEntry is a codec built for requests that name it, or why it could
// not be built.
type codecEntry struct {
	codec kernel.Codec
	err   error
}

// serve runs one unary call: decode, filters and handler, encode, reply.
func (sc *serverConn) serve(c *callCtx, f *kernel.Frame, burst bool) {
	defer sc.end(c)
	if cn := sc.srv.console; cn != nil {
		defer cn.record(sc, c, cn.mono()) // after the answer is written
	}
	out := &c.out
	out.Type, out.Flags, out.CallID = kernel.FrameResponse, kernel.FlagEndStream, c.id

	resp, codec, lent, err := sc.run(c, f)
	if codec != nil {
		out.Codec = codec.Name()
	}
	if err == nil {
		if out.Payload, err = encodeInto(sc.conn, codec, resp); err != nil {
			sc.logCodecPanic(c.info.Method, err)
			err = kernel.Errorf(kernel.Internal, "encode response of %s with %s: %v", c.info.Method, codec.Name(), err)
		}
		c.info.ResponseSize = len(out.Payload)
	}
	if err != nil {
		err = notOK(err)
	}
	if c.desc != nil && len(c.desc.observe) > 0 {
		// After the answer is written, with what was sent: an answer the
		// transport refused for its size went as a status (answerRefused).
		defer func() { sc.observe(c, err) }()
	}
	if lent != nil {
		// Only now: the response may have pointed into the request.
		lent.Release()
	}
	if err != nil {
		setStatus(out, c, err, c.info.Method)
	}
	out.Metadata = c.info.ResponseMetadata
	write := sc.conn.WriteFrame
	if q, ok := sc.conn.(kernel.FrameQueuer); ok && burst {
		write = q.QueueFrame
	}
	if werr := write(out); werr != nil {
		if sent := sc.answerRefused(c, write, werr); sent != nil {
			err, c.info.ResponseSize = sent, 0
		}
	}
}

// setStatus writes err's status into the answer out: a deadline that
// passed says it was the client's, a status that claims OK reads as
// Unknown, the message is cut to maxStatusMessage, and Retryable is kept
// only for a call refused before the filters' Invoke. what names the call
// in the deadline's message.
func setStatus(out *kernel.Frame, c *callCtx, err error, what string) {
	st := kernel.StatusOf(err)
	if errors.Is(err, context.DeadlineExceeded) && c.Err() != nil {
		msg := "the deadline the client sent passed while the server ran " + what
		if c.timeoutBy != "" {
			msg = "the " + c.timeout.String() + " deadline the " + c.timeoutBy + " filter gave the call (the client sent none) passed while the server ran " + what
		}
		st = &kernel.Status{Code: kernel.DeadlineExceeded, Message: msg}
	}
	out.Code, out.Message = st.Code, cutMessage(st.Message, maxStatusMessage)
	if st.Code == kernel.OK {
		out.Code = kernel.Unknown
	}
	// Only a call no filter's Invoke and no handler saw can be promised
	// unprocessed: a handler returning a downstream call's retryable
	// status as it got it would have its own caller send the call again.
	if st.Retryable && !c.handled {
		out.Flags |= kernel.FlagRetryable
	}
}

// notOK returns err, or, for a *kernel.Status claiming OK, one saying
// Unknown with its message: an error is no answer, the caller gets Unknown
// (setStatus), and observers (a metrics counter, a span) must count it so
// too. Only on the error path: errors.As makes its target escape.
func notOK(err error) error {
	var st *kernel.Status
	if errors.As(err, &st) && st != nil && st.Code == kernel.OK {
		return &kernel.Status{Code: kernel.Unknown, Message: st.Message}
	}
	return err
}

// maxStatusMessage bounds the status message an answer carries: a
// handler's error quoting a long or binary input must not make the answer
// too large to send.
const maxStatusMessage = 16 << 10

// cutMessage cuts msg to at most n bytes, where a character ends, saying
// how much was cut.
func cutMessage(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	note := " … (" + strconv.Itoa(len(msg)-n) + " more bytes cut)"
	return strings.ToValidUTF8(msg[:n-len(note)], "") + note
}

// maxRefusalMessage bounds the message of the answer sent in place of one
// the transport refused, so that the replacement always fits.
const maxRefusalMessage = 1 << 10

// answerRefused handles a failed write of c's answer. Refused alone for
// its size (a *Status wrapping ErrFrameTooLarge or ErrMetadataTooLarge),
// the answer becomes that status, which the caller receives at once
// instead of waiting for its deadline. Refused for another reason, or if
// even the status cannot be sent, the connection is closed, so that the
// client learns at once. It returns the status sent instead, for the
// call's observers, or nil if none was (the client then loses the
// connection). A stream's final status comes here too: c.out is free then.
func (sc *serverConn) answerRefused(c *callCtx, write func(*kernel.Frame) error, err error) *kernel.Status {
	s := sc.srv
	var st *kernel.Status
	if !errors.As(err, &st) || sc.conn.Err() != nil {
		s.log.Debug("response not sent: connection gone", "method", c.info.Method, "call_id", c.id, "err", err)
		return nil
	}
	if !errors.Is(err, kernel.ErrFrameTooLarge) && !errors.Is(err, kernel.ErrMetadataTooLarge) {
		// Refused for want of room (a client that does not read its
		// answers, say): a second answer would wait as long in vain.
		sc.closeUnanswered(c, err)
		return nil
	}
	s.log.Warn("response refused by the transport; answering with the reason instead", "method", c.info.Method, "call_id", c.id, "peer", sc.conn.RemoteAddr(), "err", err)
	msg := cutMessage("the server could not send the answer to "+c.info.Method+": "+st.Message, maxRefusalMessage)
	c.out = kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: c.id, Code: st.Code, Message: msg}
	if err := write(&c.out); err != nil {
		sc.closeUnanswered(c, err)
		return nil
	}
	return &kernel.Status{Code: st.Code, Message: msg}
}

// closeUnanswered closes a connection on which c's answer cannot be sent,
// so that the client learns at once instead of waiting for it in vain.
func (sc *serverConn) closeUnanswered(c *callCtx, err error) {
	sc.srv.log.Warn("response not sent; closing the connection so that the client learns at once", "method", c.info.Method, "call_id", c.id, "peer", sc.conn.RemoteAddr(), "err", err)
	_ = sc.conn.Close()
}

// run decodes the request with the codec it names and passes it through
// the filters to the handler. It releases f as soon as nothing can read
// from it any more: once decoded, or, if the codec's values point into
// their input (AliasingCodec, InPlaceUnmarshaler), only after the response
// is encoded, since the handler may answer with the request or parts of
// it. Then it returns f as lent, for serve to release.
func (sc *serverConn) run(c *callCtx, f *kernel.Frame) (resp any, codec kernel.Codec, lent *kernel.Frame, err error) {
	s := sc.srv
	released := false
	defer func() {
		if !released {
			f.Release()
		}
	}()
	// Before the codec is looked up: a call refused for its codec is still
	// a call of its method to observers.
	c.info.Method, c.info.Side = f.Method, kernel.ServerSide
	c.info.RequestSize = len(f.Payload)
	c.info.Peer, c.info.Metadata = sc.conn.RemoteAddr(), f.Metadata
	codec = s.codec
	if f.Codec != "" && f.Codec != codec.Name() {
		if codec, err = s.codecFor(f.Codec); err != nil {
			return nil, nil, nil, err
		}
	}
	c.info.Codec = codec.Name()
	if c.refused {
		return nil, codec, nil, &kernel.Status{Code: kernel.Unavailable, Message: "server is shutting down; the call was not processed, send it elsewhere", Retryable: true}
	}
	desc := c.desc
	if desc == nil {
		return nil, codec, nil, kernel.Errorf(kernel.Unimplemented, "method %q is not served here (service %q serves %s)", f.Method, s.cfg.Service, s.methodList())
	}
	// The deadline is kept, not timed: Done and Err look at it when asked,
	// so a handler that watches neither costs no timer.
	if f.Timeout > 0 {
		c.deadline = c.deadlineAfter(f.Timeout)
	} else if len(desc.deadliners) > 0 {
		d, by, err := sc.callTimeout(c, desc)
		if err != nil {
			return nil, codec, nil, err
		}
		if d > 0 {
			c.deadline, c.timeout, c.timeoutBy = c.deadlineAfter(d), d, by
		}
	}
	if len(desc.admit) > 0 {
		if err = sc.admit(c, desc); err != nil {
			return nil, codec, nil, err
		}
	}
	req := c.req
	aliases := codecAliases(codec)
	if d, ok := codec.(kernel.InPlaceUnmarshaler); ok {
		err, aliases = unmarshalInPlace(codec, d, f.Payload, req), true
	} else {
		err = unmarshal(codec, f.Payload, req, desc.freshRequests)
	}
	if err != nil {
		return nil, codec, nil, sc.decodeError(f.Method, codec, err)
	}
	if aliases {
		lent = f
	} else {
		f.Release()
	}
	released = true
	c.handled = true
	resp, err = sc.invoke(c, req)
	return resp, codec, lent, err
}

// decodeError is the status for a request that did not decode: the
// client's InvalidArgument, or Internal where the codec panicked (its bug
// to fix, logged with the stack).
func (sc *serverConn) decodeError(method string, codec kernel.Codec, err error) error {
	if sc.logCodecPanic(method, err) {
		return kernel.Errorf(kernel.Internal, "decode request of %s: %v", method, err)
	}
	return kernel.Errorf(kernel.InvalidArgument, "decode request of %s with %s: %v", method, codec.Name(), err)
}

// logCodecPanic logs err, with its stack, if it is a codec's panic, and
// says whether it was.
func (sc *serverConn) logCodecPanic(method string, err error) bool {
	return logCodecPanic(sc.srv.log, method, err)
}

// admit asks the filters that decide before decoding, turning a panic
// into status Internal as invoke does.
func (sc *serverConn) admit(c *callCtx, desc *methodDesc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.srv.log.Error("filter's Admit panicked", "method", c.info.Method, "panic", r, "stack", string(debug.Stack()))
			err = kernel.Errorf(kernel.Internal, "a filter admitting %s panicked: %v", c.info.Method, r)
		}
	}()
	for _, a := range desc.admit {
		if err := a.Admit(c, &c.info); err != nil {
			return err
		}
	}
	return nil
}

// callTimeout asks the method's Deadliners for the call's timeout, turning
// a panic into status Internal as admit does: it runs on the read loop,
// where a panic would take the server down.
func (sc *serverConn) callTimeout(c *callCtx, desc *methodDesc) (d time.Duration, by string, err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.srv.log.Error("filter's CallTimeout panicked", "method", c.info.Method, "panic", r, "stack", string(debug.Stack()))
			err = kernel.Errorf(kernel.Internal, "a filter timing %s panicked: %v", c.info.Method, r)
		}
	}()
	d, by = timeoutFrom(desc.deadliners, &c.info)
	return d, by, nil
}

// observe tells the method's CallObservers that c was answered, turning
// a panic into a logged error: the answer is out, and the server stays up.
func (sc *serverConn) observe(c *callCtx, err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.srv.log.Error("filter's CallEnded panicked", "method", c.info.Method, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	for _, o := range c.desc.observe {
		o.CallEnded(&c.info, err, c.handled)
	}
}

// invoke runs the chain, turning a panic into status Internal so that one
// bad handler costs one call, not the server.
func (sc *serverConn) invoke(c *callCtx, req any) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			sc.srv.log.Error("handler panicked", "method", c.info.Method, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, kernel.Errorf(kernel.Internal, "handler for %s panicked: %v", c.info.Method, r)
		}
	}()
	return c.desc.invoke(c, &c.info, req)
}

// codecFor returns the codec a request named other than the configured
// one. Every codec registered in this binary serves: the client's choice
// travels with each call, and the answer goes back in the same codec. One
// the server was not configured with is built with its default options
// the first time a request names it, and kept. Only registered names are
// kept, so made-up names cost a peer an error, not the server memory.
func (s *Server) codecFor(name string) (kernel.Codec, error) {
	if e, ok := (*s.others.Load())[name]; ok {
		return e.codec, e.err
	}
	if err := kernel.CheckOptions(kernel.KindCodec, name, nil, ""); err != nil {
		known := ""
		var unknown *kernel.UnknownPluginError
		if errors.As(err, &unknown) {
			known = strings.Join(unknown.Known, ", ")
		}
		return nil, kernel.Errorf(kernel.InvalidArgument, "codec %q is not loaded by this server (it has %s); pick one of those in the client's config", name, known)
	}
	s.othersMu.Lock()
	defer s.othersMu.Unlock()
	old := *s.others.Load()
	if e, ok := old[name]; ok {
		return e.codec, e.err
	}
	var e codecEntry
	var err error
	if e.codec, err = kernel.NewCodec(name, nil, "default options"); err != nil {
		e.err = kernel.Errorf(kernel.FailedPrecondition, "codec %q does not build with its default options (%v); configure it as the server's codec, with the options it needs", name, err)
	} else {
		s.log.Debug("serving a codec requests ask for, with its default options", "codec", name)
	}
	next := make(map[string]codecEntry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = e
	s.others.Store(&next)
	return e.codec, e.err
}

// closeOtherCodecs closes the codecs codecFor built, as plugins.close
// closes the configured ones.
func (s *Server) closeOtherCodecs() {
	s.othersMu.Lock()
	defer s.othersMu.Unlock()
	for name, e := range *s.others.Load() {
		if c, ok := e.codec.(io.Closer); ok {
			if err := c.Close(); err != nil {
				s.log.Warn("closing codec", "codec", name, "err", err)
			}
		}
	}
}

func (s *Server) methodList() string {
	m := s.Methods()
	if len(m) == 0 {
		return "no methods"
	}
	return strings.Join(m, ", ")
}
