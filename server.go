package kernrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Server serves the methods registered on it over the configured transport
// and codec, announces itself in the configured registry, and runs the
// server-side filters around every call.
type Server struct {
	cfg       *Config
	log       *slog.Logger
	transport kernel.Transport
	codec     kernel.Codec // the configured one, used when a request names none
	registry  kernel.Registry
	filters   []configuredFilter
	plugins   *plugins // everything built from config, closed on shutdown

	mu       sync.Mutex
	methods  map[string]*methodDesc
	started  bool
	listener kernel.Listener
	instance kernel.Instance
	conns    map[*serverConn]struct{}
	stopped  chan struct{} // closed when Shutdown has finished

	baseCtx    context.Context
	cancelBase context.CancelFunc
	draining   atomic.Bool
	inflight   atomic.Int64
	idle       chan struct{} // signalled when inflight drops to 0 while draining
	acceptDone chan struct{}
	shutdown   sync.Once

	// others holds the registered codecs other than the configured one that
	// requests have named, built on first use (see codecFor). It is copied
	// on write, so that finding a codec takes no lock.
	others   atomic.Pointer[map[string]codecEntry]
	othersMu sync.Mutex
}

// codecEntry is a codec built for requests that name it, or why it could
// not be built.
type codecEntry struct {
	codec kernel.Codec
	err   error
}

type methodDesc struct {
	newRequest func() any
	// invoke runs the filters that apply to the method around its handler;
	// it is built at Start, once every method and filter is known.
	invoke kernel.Invoker
	// slowCalls counts down the calls still to be served off the reader
	// since the method proved slow; overBudget is its score of slow calls
	// (see noteBurstCall).
	slowCalls  atomic.Int32
	overBudget atomic.Int32
}

// noteBurstCall learns from how long a call served inline in a burst took:
// a slow call raises the method's score, a quick one lowers it, so a method
// whose calls are mostly slow gets there even if quick ones (cancelled or
// failing early, say) come between.
func (d *methodDesc) noteBurstCall(took time.Duration) {
	if took <= burstBudget {
		for n := d.overBudget.Load(); n > 0 && !d.overBudget.CompareAndSwap(n, n-1); n = d.overBudget.Load() {
		}
		return
	}
	d.noteSlowCall()
}

// noteSlowCall counts one slow call of d; enough of them make d slow.
func (d *methodDesc) noteSlowCall() {
	if d.overBudget.Add(1) >= overBudgetStreak {
		d.overBudget.Store(0)
		d.slowCalls.Store(slowMethodCalls)
	}
}

// latelySlow reports whether a call of d should be served off the reader.
// A nil d (unknown method) is answered at once, so it is served inline.
func (d *methodDesc) latelySlow() bool {
	if d == nil || d.slowCalls.Load() <= 0 {
		return false
	}
	d.slowCalls.Add(-1)
	return true
}

// NewServer builds a server from cfg: it looks up every plugin by name and
// builds it from its options. It does not listen yet; see Start and Serve.
func NewServer(cfg *Config) (*Server, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		log:        slog.Default().With("component", "kernrpc.server", "service", cfg.Service),
		methods:    make(map[string]*methodDesc),
		conns:      make(map[*serverConn]struct{}),
		idle:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		acceptDone: make(chan struct{}),
	}
	ps, err := buildPlugins(cfg, kernel.ServerSide)
	if err != nil {
		return nil, err
	}
	s.plugins = ps
	s.transport, s.codec, s.registry = ps.transport, ps.codec, ps.registry
	s.others.Store(&map[string]codecEntry{})
	s.filters = ps.callFilters
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	return s, nil
}

// Handle registers a typed handler for method (any string; by convention
// "Service.Method"). Req and Resp are the message types the codec decodes
// and encodes (for protobuf, generated message structs). Register every
// method before Start.
func Handle[Req, Resp any](s *Server, method string, h func(ctx context.Context, req *Req) (*Resp, error)) {
	if err := s.Register(method, func() any { return new(Req) }, func(ctx context.Context, req any) (any, error) {
		return h(ctx, req.(*Req))
	}); err != nil {
		panic(err)
	}
}

// Register adds a handler for method without generics: newRequest returns a
// fresh value to decode a request into, and handler answers it. Handle is
// the typed front end; Register suits gateways and reflection.
func (s *Server) Register(method string, newRequest func() any, handler func(ctx context.Context, req any) (any, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case method == "":
		return errors.New("kernrpc: Register: empty method name")
	case s.started:
		return fmt.Errorf("kernrpc: Register %q: the server has started; register every method before Start", method)
	case s.methods[method] != nil:
		return fmt.Errorf("kernrpc: Register %q: method registered twice", method)
	}
	s.methods[method] = &methodDesc{newRequest: newRequest, invoke: func(ctx context.Context, _ *kernel.CallInfo, req any) (any, error) {
		return handler(ctx, req)
	}}
	return nil
}

// Methods lists the registered methods, sorted.
func (s *Server) Methods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.methods))
	for m := range s.methods {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Start listens, registers the instance in the registry and starts
// accepting connections. It returns once the server is reachable.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("kernrpc: Start: the server has already started")
	}
	s.started = true
	for name, d := range s.methods {
		d.invoke = chainFor(s.filters, name, d.invoke)
	}
	s.mu.Unlock()

	ln, err := s.transport.Listen(ctx, s.cfg.Address)
	if err != nil {
		return fmt.Errorf("kernrpc: listen on %s with %s: %w", s.cfg.Address, s.cfg.Transport.Name, err)
	}
	addr := ln.Addr()
	if s.cfg.Advertise != "" {
		addr = s.cfg.Advertise
	}
	inst := kernel.Instance{
		Service:  s.cfg.Service,
		ID:       s.cfg.Server.InstanceID,
		Address:  addr,
		Metadata: map[string]string{"transport": s.cfg.Transport.Name, "codec": s.codec.Name()},
	}
	for k, v := range s.cfg.Server.Metadata {
		inst.Metadata[k] = v
	}
	if inst.ID == "" {
		inst.ID = s.cfg.Service + "@" + addr
	}
	s.mu.Lock()
	s.listener, s.instance = ln, inst
	s.mu.Unlock()
	go s.acceptLoop(ln)
	if s.cfg.Service != "" {
		if err := s.registry.Register(ctx, inst, s.cfg.Server.RegisterTTL.D()); err != nil {
			_ = ln.Close()
			<-s.acceptDone
			return fmt.Errorf("kernrpc: register %s at %s in %s: %w", inst.Service, inst.Address, s.cfg.Registry.Name, err)
		}
	}
	s.log.Info("serving", "address", addr, "transport", s.cfg.Transport.Name, "codec", s.codec.Name(), "registry", s.cfg.Registry.Name)
	return nil
}

// Addr is the address clients dial; empty before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instance.Address
}

// Instance is what the server registered; zero before Start.
func (s *Server) Instance() kernel.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instance
}

// Serve starts the server and blocks until ctx is done (then shuts down
// gracefully within the configured shutdown_timeout) or Shutdown is called.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.Server.ShutdownTimeout.D())
		defer cancel()
		return s.Shutdown(sctx)
	case <-s.stopped:
		return nil
	}
}

func (s *Server) acceptLoop(ln kernel.Listener) {
	defer close(s.acceptDone)
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept(s.baseCtx)
		if err != nil {
			if errors.Is(err, kernel.ErrClosed) || s.baseCtx.Err() != nil || s.draining.Load() {
				return
			}
			s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		sc := &serverConn{srv: s, conn: c, calls: make(map[uint64]*callCtx)}
		s.mu.Lock()
		if s.draining.Load() {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		go sc.readLoop()
	}
}

// Shutdown stops the server gracefully: it stops accepting, sends every
// connected client a GoAway (new calls go elsewhere; calls that still
// arrive are refused as retryable), waits for in-flight calls until ctx is
// done, then closes the connections (cancelling what still runs),
// deregisters the instance and closes the plugins. It is safe to call more
// than once; later calls wait for the first.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutdown.Do(func() { err = s.doShutdown(ctx) })
	<-s.stopped
	return err
}

func (s *Server) doShutdown(ctx context.Context) error {
	defer close(s.stopped)
	s.mu.Lock()
	s.draining.Store(true)
	ln, started := s.listener, s.started
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	if !started || ln == nil {
		s.cancelBase()
		s.plugins.close(s.log)
		s.closeOtherCodecs()
		return nil
	}
	_ = ln.Close()
	<-s.acceptDone
	for _, sc := range conns {
		sc.goAway()
	}
	s.log.Info("shutting down: draining in-flight calls", "in_flight", s.inflight.Load(), "connections", len(conns))
	var drainErr error
	for s.inflight.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			drainErr = fmt.Errorf("kernrpc: shutdown: deadline passed with calls still in flight (%d); they were cancelled: %w", s.inflight.Load(), ctx.Err())
		}
		if drainErr != nil {
			break
		}
	}
	s.cancelBase()
	s.closeConns(ctx)
	var errs []error
	if drainErr != nil {
		errs = append(errs, drainErr)
	}
	if s.cfg.Service != "" {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.registry.Deregister(dctx, s.instance); err != nil {
			errs = append(errs, fmt.Errorf("kernrpc: deregister %s: %w", s.instance.ID, err))
		}
		cancel()
	}
	s.plugins.close(s.log)
	s.closeOtherCodecs()
	s.log.Info("stopped")
	return errors.Join(errs...)
}

// closeConns ends the connections of a drained server. Where the transport
// can half-close, it does, and waits (briefly) for each client to close
// its side: a request already on its way is then read and left unserved
// rather than lost in a reset, and the client resends it elsewhere.
func (s *Server) closeConns(ctx context.Context) {
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	for _, sc := range conns {
		if hc, ok := sc.conn.(kernel.HalfCloser); ok && hc.CloseWrite() == nil {
			select {
			case <-sc.conn.Done():
			case <-grace.C:
			case <-ctx.Done():
			}
		}
		_ = sc.conn.Close()
	}
}

// closeGrace bounds how long a drained server waits for its clients to
// close their side of the connections.
const closeGrace = time.Second

func (s *Server) callEnded() {
	if s.inflight.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// serverConn is one client connection on the server side.
type serverConn struct {
	srv  *Server
	conn kernel.Conn

	readState     atomic.Int32  // reading, servingInline or handedOff
	inlineSeq     atomic.Uint64 // counts calls served inline
	inlineDesc    atomic.Pointer[methodDesc]
	watchdog      atomic.Pointer[time.Timer] // made by the first inline call
	watchdogArmed atomic.Bool
	watchedSeq    uint64 // inlineSeq at the watchdog's last tick; only watch touches it

	mu     sync.Mutex
	calls  map[uint64]*callCtx
	closed bool
	// lastAccepted is the highest call id accepted for serving. Once the
	// server drains, no higher id is served, and the GoAway says so: the
	// client may then safely resend any higher-numbered call.
	lastAccepted uint64
}

// goAway tells the client to send new calls elsewhere, naming the last call
// this connection will serve.
func (sc *serverConn) goAway() {
	sc.mu.Lock()
	last := sc.lastAccepted
	sc.mu.Unlock()
	sc.queue(&kernel.Frame{Type: kernel.FrameGoAway, CallID: last})
}

// readLoop reads frames until the connection dies. A request is served by
// the goroutine that read it, which is already running, so it costs no
// hand-off: a lone caller costs the server no goroutine creation and no
// wake-up per call. When more requests are already buffered (a burst),
// they are served one after another on the same goroutine and their
// answers queued, so the burst is answered in one write. A method that has
// lately been slow (it outran the watchdog, or burstBudget in a burst) is
// served on its own goroutine after starting a new reader, so that it
// holds nobody up; and a watchdog hands the reading to a new goroutine if
// an inline call runs long.
func (sc *serverConn) readLoop() {
	for {
		f, err := sc.conn.ReadFrame(context.Background())
		if err != nil {
			sc.close(err)
			return
		}
		switch f.Type {
		case kernel.FrameRequest:
			c := sc.begin(f)
			if c == nil {
				f.Release()
				continue
			}
			desc := sc.srv.methods[f.Method]
			c.desc = desc
			if desc.latelySlow() {
				go sc.readLoop()
				sc.serve(c, f, false)
				return
			}
			if !sc.serveInline(c, f, desc, sc.moreWaiting()) {
				return
			}
			continue
		case kernel.FrameCancel:
			sc.mu.Lock()
			c := sc.calls[f.CallID]
			sc.mu.Unlock()
			if c != nil {
				c.cancel(context.Canceled)
			}
		case kernel.FrameGoAway:
			// The client is leaving; its calls still get answers.
		default:
			sc.srv.log.Debug("ignoring unexpected frame", "type", f.Type, "call_id", f.CallID, "peer", sc.conn.RemoteAddr())
		}
		f.Release()
	}
}

const (
	reading       = iota // the read loop holds the reading role
	servingInline        // the reader is serving a call; the watchdog may take over
	handedOff            // the watchdog took over: another goroutine reads now
)

// watchdogPeriod is how often a connection serving calls inline checks
// that the call it serves has not kept the connection unread for a whole
// period. An inline call blocks reading for at most two periods; after
// overBudgetStreak such calls in a row the method counts as slow and is
// served off the reader. (One late call may just have been descheduled.)
const watchdogPeriod = time.Millisecond

// burstBudget is the longest a call may take to be served inline while
// more requests of its connection wait behind it: below it, serving the
// burst on one goroutine and answering in one write beats spreading it
// over goroutines; above it, the waiting costs more than that saves.
const burstBudget = 50 * time.Microsecond

// overBudgetStreak is how far a method's score must climb (slow calls
// count up, quick ones down) before it counts as slow: one call
// descheduled or caught by the garbage collector says nothing about it.
const overBudgetStreak = 4

// slowMethodCalls is how many calls of a method that outran the watchdog
// are served off the reader before it is tried inline again.
const slowMethodCalls = 1024

func (sc *serverConn) moreWaiting() bool {
	b, ok := sc.conn.(kernel.BufferedReader)
	return ok && b.Buffered() > 0
}

// serveInline serves c on the reading goroutine and reports whether that
// goroutine still holds the reading role afterwards. The watchdog timer is
// not armed per call (a timer per call costs a netpoller wake-up each): it
// ticks while inline calls keep coming and lapses when they stop.
func (sc *serverConn) serveInline(c *callCtx, f *kernel.Frame, desc *methodDesc, burst bool) bool {
	sc.inlineSeq.Add(1)
	sc.inlineDesc.Store(desc)
	sc.readState.Store(servingInline)
	if !sc.watchdogArmed.Load() && sc.watchdogArmed.CompareAndSwap(false, true) {
		if t := sc.watchdog.Load(); t != nil {
			t.Reset(watchdogPeriod)
		} else {
			// Stopped until stored, so that watch always finds it.
			t = time.AfterFunc(time.Hour, sc.watch)
			sc.watchdog.Store(t)
			t.Reset(watchdogPeriod)
		}
	}
	if !burst {
		sc.serve(c, f, false)
		return sc.readState.CompareAndSwap(servingInline, reading)
	}
	// In a burst the calls queued behind this one wait for it: a method
	// that takes longer than a few syscalls would save is served off the
	// reader from now on, in parallel.
	start := time.Now()
	sc.serve(c, f, true)
	if desc != nil {
		desc.noteBurstCall(time.Since(start))
	}
	return sc.readState.CompareAndSwap(servingInline, reading)
}

// watch runs on the timer's goroutine. If the same inline call is still
// running since the last tick, this goroutine takes over the reading.
func (sc *serverConn) watch() {
	seq := sc.inlineSeq.Load()
	if seq == sc.watchedSeq && sc.readState.Load() == servingInline &&
		sc.readState.CompareAndSwap(servingInline, handedOff) {
		if d := sc.inlineDesc.Load(); d != nil {
			d.noteSlowCall()
		}
		sc.watchdogArmed.Store(false)
		sc.readLoop()
		return
	}
	if seq == sc.watchedSeq {
		// No inline call for a whole period: let the watchdog lapse.
		sc.watchdogArmed.Store(false)
		return
	}
	sc.watchedSeq = seq
	sc.watchdog.Load().Reset(watchdogPeriod)
}

// begin records a request so a Cancel can find it. A duplicate call id is a
// protocol error the client made: answer it without serving.
func (sc *serverConn) begin(f *kernel.Frame) *callCtx {
	c := &callCtx{parent: sc.srv.baseCtx, id: f.CallID, sc: sc}
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return nil
	}
	if _, dup := sc.calls[f.CallID]; dup {
		sc.mu.Unlock()
		sc.srv.log.Warn("request reuses the id of a call in flight; refusing it", "call_id", f.CallID, "peer", sc.conn.RemoteAddr())
		sc.queue(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: f.CallID, Code: kernel.InvalidArgument,
			Message: "call id " + fmt.Sprint(f.CallID) + " is already in flight on this connection"})
		return nil
	}
	sc.calls[f.CallID] = c
	// Checked under sc.mu, which goAway also takes after draining is set:
	// a call is either counted in the GoAway or refused, never both.
	if sc.srv.draining.Load() {
		c.refused = true
	} else {
		sc.lastAccepted = max(sc.lastAccepted, f.CallID)
	}
	sc.mu.Unlock()
	sc.srv.inflight.Add(1)
	return c
}

func (sc *serverConn) end(c *callCtx) {
	if c.timer != nil {
		c.timer.Stop()
	}
	sc.mu.Lock()
	delete(sc.calls, c.id)
	sc.mu.Unlock()
	c.cancel(context.Canceled)
	sc.srv.callEnded()
}

// queue sends f without writing on the caller's goroutine where the
// transport allows: the read loop and Shutdown use it, and neither may
// wait on a peer that does not read.
func (sc *serverConn) queue(f *kernel.Frame) {
	write := sc.conn.WriteFrame
	if q, ok := sc.conn.(kernel.FrameQueuer); ok {
		write = q.QueueFrame
	}
	if err := write(f); err != nil {
		sc.srv.log.Debug("frame not sent: connection gone", "type", f.Type, "call_id", f.CallID, "err", err)
	}
}

// serve runs one unary call: decode, filters and handler, encode, reply.
func (sc *serverConn) serve(c *callCtx, f *kernel.Frame, burst bool) {
	s := sc.srv
	defer sc.end(c)
	out := &c.out
	out.Type, out.Flags, out.CallID = kernel.FrameResponse, kernel.FlagEndStream, c.id

	resp, codec, lent, err := sc.run(c, f)
	if codec != nil {
		out.Codec = codec.Name()
	}
	if err == nil {
		if out.Payload, err = encodeInto(sc.conn, codec, resp); err != nil {
			err = kernel.Errorf(kernel.Internal, "encode response of %s with %s: %v", c.info.Method, codec.Name(), err)
		}
	}
	if lent != nil {
		// Only now: the response may have pointed into the request.
		lent.Release()
	}
	if err != nil {
		st := kernel.StatusOf(err)
		if errors.Is(err, context.DeadlineExceeded) && c.Err() != nil {
			st = kernel.Errorf(kernel.DeadlineExceeded, "the deadline the client sent passed while the server ran %s", c.info.Method).(*kernel.Status)
		}
		out.Code, out.Message = st.Code, st.Message
		if st.Code == kernel.OK {
			out.Code = kernel.Unknown
		}
		if st.Retryable {
			out.Flags |= kernel.FlagRetryable
		}
	}
	out.Metadata = c.info.ResponseMetadata
	write := sc.conn.WriteFrame
	if q, ok := sc.conn.(kernel.FrameQueuer); ok && burst {
		write = q.QueueFrame
	}
	if err := write(out); err != nil {
		var st *kernel.Status
		if errors.As(err, &st) && sc.conn.Err() == nil {
			// The transport refused the answer (the client has not read for
			// a long while, say): close, or the client waits for it in vain.
			s.log.Warn("response not sent; closing the connection so that the client learns at once", "method", c.info.Method, "call_id", c.id, "peer", sc.conn.RemoteAddr(), "err", err)
			_ = sc.conn.Close()
			return
		}
		s.log.Debug("response not sent: connection gone", "method", c.info.Method, "call_id", c.id, "err", err)
	}
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
	codec = s.codec
	if f.Codec != "" && f.Codec != codec.Name() {
		if codec, err = s.codecFor(f.Codec); err != nil {
			return nil, nil, nil, err
		}
	}
	c.info.Method, c.info.Side, c.info.Codec = f.Method, kernel.ServerSide, codec.Name()
	c.info.Peer, c.info.Metadata = sc.conn.RemoteAddr(), f.Metadata
	if c.refused {
		return nil, codec, nil, &kernel.Status{Code: kernel.Unavailable, Message: "server is shutting down; the call was not processed, send it elsewhere", Retryable: true}
	}
	if f.Flags&kernel.FlagStream != 0 {
		return nil, codec, nil, kernel.Errorf(kernel.Unimplemented, "%s: streaming calls are not supported by this server yet", f.Method)
	}
	desc := c.desc
	if desc == nil {
		return nil, codec, nil, kernel.Errorf(kernel.Unimplemented, "method %q is not served here (service %q serves %s)", f.Method, s.cfg.Service, s.methodList())
	}
	if f.Timeout > 0 {
		c.deadline = time.Now().Add(f.Timeout)
		c.timer = time.AfterFunc(f.Timeout, func() { c.cancel(context.DeadlineExceeded) })
	}
	req := desc.newRequest()
	aliases := codecAliases(codec)
	if d, ok := codec.(kernel.InPlaceUnmarshaler); ok {
		err, aliases = d.UnmarshalInPlace(f.Payload, req), true
	} else {
		err = codec.Unmarshal(f.Payload, req)
	}
	if err != nil {
		return nil, codec, nil, kernel.Errorf(kernel.InvalidArgument, "decode request of %s with %s: %v", f.Method, codec.Name(), err)
	}
	if aliases {
		lent = f
	} else {
		f.Release()
	}
	released = true
	resp, err = sc.invoke(c, req)
	return resp, codec, lent, err
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

// close is called once the connection is dead: calls still running are
// cancelled, since nobody can receive their answers.
func (sc *serverConn) close(err error) {
	sc.mu.Lock()
	sc.closed = true
	calls := make([]*callCtx, 0, len(sc.calls))
	for _, c := range sc.calls {
		calls = append(calls, c)
	}
	sc.mu.Unlock()
	for _, c := range calls {
		c.cancel(context.Canceled)
	}
	if t := sc.watchdog.Load(); t != nil {
		t.Stop()
	}
	_ = sc.conn.Close()
	s := sc.srv
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
	if errors.Is(err, kernel.ErrClosed) || errors.Is(err, kernel.ErrPeerGone) || errors.Is(err, io.EOF) {
		s.log.Debug("connection closed", "peer", sc.conn.RemoteAddr(), "reason", err)
	} else {
		s.log.Warn("connection closed", "peer", sc.conn.RemoteAddr(), "reason", err)
	}
}
