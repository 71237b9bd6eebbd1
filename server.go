package kernrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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
	headroom  headroomHold

	mu       sync.Mutex
	methods  map[string]*methodDesc
	started  bool
	listener kernel.Listener
	// unlisted is set when Start failed to register the instance: no
	// client learned of it from the registry, so Shutdown waits no drain
	// period for them to learn it left.
	unlisted bool
	instance kernel.Instance
	conns    map[*serverConn]time.Time // when each was accepted
	stopped  chan struct{}             // closed when Shutdown has finished

	baseCtx    context.Context
	cancelBase context.CancelFunc
	draining   atomic.Bool
	inflight   atomic.Int64
	idle       chan struct{} // signalled when inflight drops to 0 while draining
	acceptDone chan struct{}
	shutdown   sync.Once

	// A Shutdown that finds Start still running cancels it and waits for
	// it, so that nothing Start does (the registration, the load reporter)
	// lands after Shutdown undid it; a Start after Shutdown is refused.
	startMu     sync.Mutex
	stopping    bool
	startCancel context.CancelFunc
	startDone   chan struct{} // closed when Start returns

	health    health
	regLock   chan struct{} // held while writing the instance to the registry; see lockRegistry
	completed atomic.Int64  // calls ended, for load reports
	loadDone  chan struct{} // closed when the load reporter has stopped; nil without one
	stopLoad  context.CancelFunc
	admin     *adminServer // nil without server.admin_address
	console   *console     // the status console and its call figures; nil without server.admin_address

	streamsOpen   atomic.Int64   // streams whose handler runs now
	streamsTotal  atomic.Int64   // streams opened, since start
	refusedConns  atomic.Int64   // over max_connections, since start
	acceptedConns atomic.Int64   // held, since start
	refusedLogged atomic.Int64   // when that was last logged, in Unix nanoseconds
	refusing      atomic.Int32   // refused connections being told why (refuseConn)
	refusals      sync.WaitGroup // their goroutines, which Shutdown waits for

	// others holds the registered codecs other than the configured one that
	// requests have named, built on first use (see codecFor). It is copied
	// on write, so that finding a codec takes no lock.
	others   atomic.Pointer[map[string]codecEntry]
	othersMu sync.Mutex

	// reflection holds the descriptors registered beyond
	// protoregistry.GlobalFiles, for the reflection service (reflection.go).
	reflection reflectionFiles
}

// NewServer builds a server from cfg: it looks up every plugin by name and
// builds it from its options. It does not listen yet; see Start and Serve.
// The server keeps a copy of cfg's settings: changing cfg afterwards (to
// make another server) leaves this one as it was made.
func NewServer(cfg *Config) (*Server, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	cfg.applyDefaults()
	if err := cfg.validateFields(); err != nil {
		return nil, err
	}
	// The server's own copy: it reads its service name, metadata and
	// limits at Start and for as long as it serves.
	own := *cfg
	own.Server.Metadata = maps.Clone(cfg.Server.Metadata)
	cfg = &own
	s := &Server{
		cfg:        cfg,
		log:        slog.Default().With("component", "kernrpc.server", "service", cfg.Service),
		methods:    make(map[string]*methodDesc),
		conns:      make(map[*serverConn]time.Time),
		idle:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		regLock:    make(chan struct{}, 1),
		acceptDone: make(chan struct{}),
	}
	ps, err := buildPlugins(cfg, kernel.ServerSide)
	if err != nil {
		return nil, err
	}
	s.plugins = ps
	s.headroom = headroomHold{size: int(*cfg.GCHeadroom), log: s.logger}
	s.transport, s.codec, s.registry = ps.transport, ps.codec, ps.registry
	s.others.Store(&map[string]codecEntry{})
	s.filters = ps.callFilters
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.registerHealth()
	if cfg.Server.Reflection {
		s.registerReflection()
	}
	ps.observePlugins(kernel.ServerSide, serverState{s})
	return s, nil
}

// Handle registers a typed handler for method (any string; by convention
// "Service.Method"). Req and Resp are the message types the codec decodes
// and encodes (for protobuf, generated message structs). Register every
// method before Start. Like http.HandleFunc, Handle panics on a misuse
// (an empty method name, one already registered, a server started) that
// Register would return as an error. A nil response with a nil error
// answers the empty message, as grpc-go does: protobuf reads a nil
// message as an empty one.
//
// The request is made in one allocation with the call's context (some
// 470 bytes), so a handler that keeps its request after returning keeps
// that memory too, and one that keeps its context keeps the request.
func Handle[Req, Resp any](s *Server, method string, h func(ctx context.Context, req *Req) (*Resp, error)) {
	if err := s.register(method, &methodDesc{
		newCall: func() (*callCtx, any) {
			p := new(callWith[Req])
			return &p.call, &p.req
		},
		freshRequests: true,
		invoke: func(ctx context.Context, _ *kernel.CallInfo, req any) (any, error) {
			return h(ctx, req.(*Req))
		},
	}); err != nil {
		panic(err)
	}
}

// callWith is a call's context and its request in one allocation, for a
// method whose request type is known when it is registered (Handle): a
// call then costs the server one allocation fewer.
type callWith[Req any] struct {
	call callCtx
	req  Req
}

// Register adds a handler for method without generics: newRequest returns a
// fresh value to decode a request into, and handler answers it. Handle is
// the typed front end; Register suits gateways and reflection.
func (s *Server) Register(method string, newRequest func() any, handler func(ctx context.Context, req any) (any, error)) error {
	return s.register(method, &methodDesc{
		newCall: func() (*callCtx, any) { return new(callCtx), newRequest() },
		invoke: func(ctx context.Context, _ *kernel.CallInfo, req any) (any, error) {
			return handler(ctx, req)
		},
	})
}

func (s *Server) register(method string, d *methodDesc) error {
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
	s.methods[method] = d
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
// accepting connections. It returns once the server is reachable. A
// server starts once: after Start fails, Shutdown releases the plugins
// NewServer built.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("kernrpc: Start: the server has already started")
	}
	s.started = true
	ctx, end := s.beginStart(ctx)
	if end == nil {
		s.mu.Unlock()
		return errors.New("kernrpc: Start: the server has been shut down; make a new one")
	}
	defer end()
	for name, d := range s.methods {
		if d.stream != nil {
			d.stream.invoke = streamChain(filtersAs[kernel.StreamFilter](s.filters, name), streamTerminal)
			continue
		}
		d.invoke = chainFor(s.filters, name, d.invoke)
		d.admit = filtersAs[kernel.Admitter](s.filters, name)
		d.deadliners = deadliners(s.filters)
		d.observe = filtersAs[kernel.CallObserver](s.filters, name)
		d.valuers = filtersAs[kernel.ContextValuer](s.filters, name)
	}
	methods := slices.Sorted(maps.Keys(s.methods))
	s.mu.Unlock()
	for _, u := range unmatched(s.filters, methods) {
		s.log.Warn("a filter's method pattern matches none of the methods this server serves; check its spelling, or give the entry side: client if it names methods this process calls",
			"filter", u.filter, "pattern", u.pattern, "methods", methods)
	}

	ln, err := s.transport.Listen(ctx, s.cfg.Address)
	if err != nil {
		return &kernel.PluginError{Source: s.cfg.Source, Kind: kernel.KindTransport, Name: s.cfg.Transport.Name, Err: err}
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
	// Before the listener is recorded: a server whose admin pages cannot
	// be served has not started, and Shutdown closes only its plugins.
	if err := s.startAdmin(); err != nil {
		_ = ln.Close()
		return err
	}
	s.mu.Lock()
	if s.draining.Load() {
		// A Shutdown whose context ended before this Start did gave up
		// waiting for it and has finished: nothing may serve now.
		s.mu.Unlock()
		_ = ln.Close()
		s.stopAdmin(ctx)
		return errors.New("kernrpc: Start: the server was shut down while it started")
	}
	s.listener, s.instance = ln, inst
	s.mu.Unlock()
	go s.acceptLoop(ln)
	s.mu.Lock()
	for svc := range s.health.status {
		if !s.health.set[svc] {
			s.health.status[svc] = HealthServing
		}
	}
	s.mu.Unlock()
	if err := s.syncRegistration(ctx); err != nil {
		// The server will serve nothing: its health must not say it
		// does, nor SetServingStatus register it.
		s.mu.Lock()
		s.unlisted = true
		s.health.stopping = true
		for svc := range s.health.status {
			s.health.status[svc] = HealthNotServing
		}
		s.mu.Unlock()
		_ = ln.Close()
		<-s.acceptDone
		s.stopAdmin(ctx)
		return err
	}
	s.startLoadReports()
	s.log.Info("serving", "address", addr, "transport", s.cfg.Transport.Name, "codec", s.codec.Name(), "registry", s.cfg.Registry.Name)
	return nil
}

// beginStart gives Start a context a concurrent Shutdown can cancel, and
// the func Start calls when it returns; a nil func if Shutdown has begun.
// The context is not cancelled when Start returns: it stands for the
// caller's, and a plugin that keeps it past the call (a registry's lease,
// say) must not lose it because Start returned.
func (s *Server) beginStart(ctx context.Context) (context.Context, func()) {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	if s.stopping {
		return ctx, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.startCancel, s.startDone = cancel, done
	return ctx, func() { close(done) }
}

// shutdownBegun is whether Shutdown has been called.
func (s *Server) shutdownBegun() bool {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	return s.stopping
}

// waitStart stops a Start still running and waits until it has returned
// or ctx ends; no Start may begin after it.
func (s *Server) waitStart(ctx context.Context) {
	s.startMu.Lock()
	s.stopping = true
	cancel, done := s.startCancel, s.startDone
	s.startMu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	s.log.Info("shutting down: waiting for Start to return")
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Plugins lists the plugins this server built from its config, so that
// code can reach them (a filter's counters, say); see FindPlugin.
func (s *Server) Plugins() []BuiltPlugin { return s.plugins.list() }

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
// If the server cannot start, Serve releases the plugins NewServer built
// and returns why.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		if s.shutdownBegun() {
			<-s.stopped // Shutdown, called meanwhile, stopped the start
			return nil
		}
		// Nothing was served, so nothing waits for a drain: a context
		// already done makes Shutdown close at once what is open.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_ = s.Shutdown(done)
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
		if !s.admitConnLocked() {
			s.mu.Unlock()
			s.refuseConn(c)
			continue
		}
		s.conns[sc] = time.Now()
		s.acceptedConns.Add(1)
		sc.startIdleWatch()
		s.mu.Unlock()
		go sc.readLoop()
	}
}

// Shutdown stops the server gracefully: its health turns NOT_SERVING and
// it deregisters the instance, serves on for server.drain_period (while
// clients learn it left; not after a Start that failed to register it),
// then stops accepting, sends every connected
// client a GoAway (new calls go elsewhere; what a client sent before it
// read the GoAway is still served, and what comes after its answer, or a
// second without one, is refused as retryable: server_drain.go), waits
// for in-flight calls until ctx is done, then
// closes the connections (cancelling what still runs) and the plugins. It
// is safe to call more than once; later calls wait for the first.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutdown.Do(func() { err = s.doShutdown(ctx) })
	<-s.stopped
	return err
}

func (s *Server) doShutdown(ctx context.Context) error {
	defer close(s.stopped)
	defer s.headroom.release()
	s.waitStart(ctx)
	s.mu.Lock()
	started := s.started && s.listener != nil
	unlisted := s.unlisted
	if !started {
		// Under s.mu, which Start takes to record its listener: a Start
		// still running (its wait cut short by ctx) then sees it and
		// closes what it opened.
		s.draining.Store(true)
	}
	s.mu.Unlock()
	if !started {
		s.cancelBase()
		s.plugins.close(s.logger)
		s.closeOtherCodecs()
		return nil
	}
	var errs []error
	// Out of the registry first, and still serving for the drain period:
	// clients that have not heard yet keep getting answers meanwhile.
	s.setAllNotServing()
	s.stopLoadReports(ctx)
	if err := s.deregister(ctx); err != nil {
		errs = append(errs, err)
	}
	if !unlisted {
		s.waitDrainPeriod(ctx)
	}

	s.mu.Lock()
	s.draining.Store(true)
	ln := s.listener
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	_ = ln.Close()
	<-s.acceptDone
	if err := s.drainConns(ctx, conns); err != nil {
		if n := s.abortStreams("its shutdown timeout passed first"); n > 0 {
			s.log.Warn("shutting down: ended the streams still open with Unavailable", "streams", n)
		}
		errs = append(errs, err)
	}
	s.cancelBase()
	s.refusals.Wait() // cut short by cancelBase
	s.closeConns(ctx)
	s.stopAdmin(ctx)
	s.plugins.close(s.logger)
	s.closeOtherCodecs()
	s.log.Info("stopped")
	return errors.Join(errs...)
}

// deregisterTimeout bounds taking the instance out of the registry at
// shutdown, whatever the shutdown's own deadline: a shutdown in a hurry
// still owes the registry that write.
const deregisterTimeout = 5 * time.Second

// deregister takes the instance out of the registry at shutdown. Waiting
// for a registry write already under way (a registration, a load report)
// ends with ctx; the deregistration itself gets deregisterTimeout.
func (s *Server) deregister(ctx context.Context) error {
	if s.cfg.Service == "" {
		return nil
	}
	if err := s.lockRegistry(ctx); err != nil {
		return s.registryError(fmt.Errorf("deregister %s: %w", s.Instance().ID, err))
	}
	defer s.unlockRegistry()
	dctx, cancel := context.WithTimeout(context.Background(), deregisterTimeout)
	defer cancel()
	return s.advertiseLocked(dctx, false)
}

// waitDrainPeriod waits the configured drain period (or until ctx ends):
// the time clients take to hear from the registry that the instance left.
func (s *Server) waitDrainPeriod(ctx context.Context) {
	d := s.cfg.Server.DrainPeriod.D()
	if d <= 0 {
		return
	}
	s.log.Info("shutting down: deregistered; serving for the drain period", "drain_period", d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// waitInFlight waits until no call is in flight or ctx ends.
func (s *Server) waitInFlight(ctx context.Context) error {
	for s.inflight.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			return fmt.Errorf("kernrpc: shutdown: deadline passed with calls still in flight (%d); they were cancelled: %w", s.inflight.Load(), ctx.Err())
		}
	}
	return nil
}

func (s *Server) callEnded() {
	s.completed.Add(1)
	if s.inflight.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// logger is the server's logger, for code that takes a logger getter.
func (s *Server) logger() *slog.Logger { return s.log }
