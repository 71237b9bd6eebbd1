package kernel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Client calls one service: it resolves instances through the registry,
// picks one per call with the balancer, keeps a pool of multiplexed
// connections per instance, and runs the client-side filters around every
// call. It is safe for concurrent use; share one per service.
type Client struct {
	cfg       *Config
	service   string
	log       *slog.Logger
	transport Transport
	codec     Codec
	registry  Registry
	balancer  Balancer
	chains    *filterChains
	filtered  bool
	plugins   *plugins

	pools       atomic.Pointer[map[string]*connPool]
	poolsMu     sync.Mutex // serialises copy-on-write updates of pools
	closed      atomic.Bool
	stopWatch   context.CancelFunc
	watchDone   chan struct{}
	life        context.Context // ends with Close: bounds background dials
	endLife     context.CancelFunc
	dials       sync.WaitGroup
	callStates  sync.Pool
	dialTimeout time.Duration
}

// NewClient builds a client for service (cfg.Service when empty) from cfg.
// It resolves the service once before returning, then follows the
// registry's watch.
func NewClient(cfg *Config, service string) (*Client, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if service == "" {
		service = cfg.Service
	}
	if service == "" {
		return nil, errors.New("kernrpc: NewClient: no service to call: pass its name or set service in the config")
	}
	c := &Client{
		cfg:         cfg,
		service:     service,
		log:         slog.Default().With("component", "kernrpc.client", "service", service),
		watchDone:   make(chan struct{}),
		dialTimeout: cfg.Client.DialTimeout.D(),
	}
	c.callStates.New = func() any { return &callState{wake: make(chan struct{}, 1)} }
	empty := map[string]*connPool{}
	c.pools.Store(&empty)
	ps, err := buildPlugins(cfg, ClientSide)
	if err != nil {
		return nil, err
	}
	c.plugins = ps
	c.transport, c.codec, c.registry, c.balancer = ps.transport, ps.codec, ps.registry, ps.balancer
	c.filtered = len(ps.filters) > 0
	c.chains = newFilterChains(ps.filters, c.invokeRemote)
	defer func() {
		if err != nil {
			ps.close(c.log)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), c.dialTimeout)
	defer cancel()
	var insts []Instance
	if insts, err = c.registry.Resolve(ctx, service); err != nil {
		err = fmt.Errorf("kernrpc: resolve %q in %s: %w", service, cfg.Registry.Name, err)
		return nil, err
	}
	c.balancer.Update(insts)
	wctx, stop := context.WithCancel(context.Background())
	var updates <-chan []Instance
	if updates, err = c.registry.Watch(wctx, service); err != nil {
		stop()
		err = fmt.Errorf("kernrpc: watch %q in %s: %w", service, cfg.Registry.Name, err)
		return nil, err
	}
	c.stopWatch = stop
	c.life, c.endLife = context.WithCancel(context.Background())
	go c.follow(updates)
	return c, nil
}

// follow feeds the registry's view to the balancer and drops the pools of
// instances that left.
func (c *Client) follow(updates <-chan []Instance) {
	defer close(c.watchDone)
	for insts := range updates {
		c.balancer.Update(insts)
		live := make(map[string]bool, len(insts))
		for _, in := range insts {
			live[in.Address] = true
		}
		c.poolsMu.Lock()
		old := *c.pools.Load()
		next := make(map[string]*connPool, len(old))
		for addr, p := range old {
			if live[addr] {
				next[addr] = p
			} else {
				p.retire()
			}
		}
		c.pools.Store(&next)
		c.poolsMu.Unlock()
	}
}

// Close closes every connection (calls in flight fail with Unavailable)
// and the plugins the client built. It is idempotent.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.endLife()
	c.stopWatch()
	<-c.watchDone
	c.poolsMu.Lock()
	for _, p := range *c.pools.Load() {
		p.close()
	}
	empty := map[string]*connPool{}
	c.pools.Store(&empty)
	c.poolsMu.Unlock()
	c.dials.Wait()
	c.plugins.close(c.log)
	return nil
}

// Call sends req to method and waits for the answer, which it decodes into
// resp. The context's deadline and cancellation reach the server; metadata
// attached with WithMetadata travels with the request. A failed call
// returns a *Status.
func (c *Client) Call(ctx context.Context, method string, req, resp any) error {
	_, err := c.call(ctx, method, req, resp)
	return err
}

// Call is an asynchronous call in progress (see Client.Go).
type Call struct {
	Method   string
	Request  any
	Response any
	// ResponseMetadata is what the server sent back with its answer.
	ResponseMetadata Metadata
	// Err is the call's outcome, set before the call is sent on Done.
	Err error
	// Done receives the call when it completes.
	Done chan *Call
}

// Go starts a call and returns at once; the call is sent on done (or on a
// new channel if done is nil) when it completes, as net/rpc does. done must
// have room: Go panics on an unbuffered channel.
func (c *Client) Go(ctx context.Context, method string, req, resp any, done chan *Call) *Call {
	if done == nil {
		done = make(chan *Call, 1)
	} else if cap(done) == 0 {
		panic("kernrpc: Client.Go: done channel is unbuffered")
	}
	call := &Call{Method: method, Request: req, Response: resp, Done: done}
	go func() {
		call.ResponseMetadata, call.Err = c.call(ctx, method, req, resp)
		call.Done <- call
	}()
	return call
}

// CallFunc starts a call and returns at once; fn runs with the finished call
// on a goroutine of its own.
func (c *Client) CallFunc(ctx context.Context, method string, req, resp any, fn func(*Call)) {
	call := &Call{Method: method, Request: req, Response: resp}
	go func() {
		call.ResponseMetadata, call.Err = c.call(ctx, method, req, resp)
		fn(call)
	}()
}

// CallWithMetadata is Call that also returns the response metadata.
func (c *Client) CallWithMetadata(ctx context.Context, method string, req, resp any) (Metadata, error) {
	return c.call(ctx, method, req, resp)
}

func (c *Client) call(ctx context.Context, method string, req, resp any) (Metadata, error) {
	if c.closed.Load() {
		return nil, Errorf(Canceled, "client for %q is closed", c.service)
	}
	if c.cfg.Client.Timeout > 0 {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.cfg.Client.Timeout.D())
			defer cancel()
		}
	}
	cs := c.callStates.Get().(*callState)
	cs.reset()
	info := &cs.info
	info.Method, info.Side, info.Codec = method, ClientSide, c.codec.Name()
	info.Metadata = OutgoingMetadata(ctx)
	info.reply, info.client = resp, cs
	var err error
	if c.filtered {
		if len(info.Metadata) > 0 {
			info.Metadata = info.Metadata.Clone() // filters may add to it
		}
		_, err = c.chains.forMethod(method)(ctx, info, req)
	} else {
		_, err = c.invokeRemote(ctx, info, req)
	}
	md := info.ResponseMetadata
	cs.reset()
	c.callStates.Put(cs)
	return md, err
}

// invokeRemote is the end of the client's filter chain: pick, send, wait.
// A call the server did not process (it was shutting down, or it could not
// be reached) is sent again to a fresh pick, up to client.retries times.
func (c *Client) invokeRemote(ctx context.Context, info *CallInfo, req any) (any, error) {
	retries := *c.cfg.Client.Retries
	for attempt, picks := 0, 0; ; attempt++ {
		inst, err := c.balancer.Pick(ctx, info)
		if err != nil {
			if errors.Is(err, ErrNoInstances) {
				return nil, &Status{Code: Unavailable, Message: fmt.Sprintf("no instance of %q to call %s: %v", c.service, info.Method, err), Retryable: true}
			}
			return nil, Errorf(Unavailable, "pick an instance of %q for %s: %v", c.service, info.Method, err)
		}
		p, err := c.pool(inst.Address)
		if err != nil {
			return nil, err
		}
		// An instance that refused a dial or said GoAway moments ago is
		// passed over while the balancer offers others.
		if picks++; picks <= maxSkippedPicks && p.avoided() {
			attempt--
			continue
		}
		info.Instance, info.Peer = inst, inst.Address
		var cc *clientConn
		if cc, err = p.get(ctx); err == nil {
			err = cc.roundTrip(ctx, c, info, req)
		}
		if obs, ok := c.balancer.(PickObserver); ok {
			obs.Done(inst, err)
		}
		if err == nil || !IsRetryable(err) || attempt >= retries || ctx.Err() != nil {
			if err != nil {
				return nil, err
			}
			return info.reply, nil
		}
		c.log.Debug("retrying a call the server did not process", "method", info.Method, "instance", inst.Address, "err", err)
	}
}

const (
	maxSkippedPicks = 8
	dialAvoidance   = time.Second
	goAwayAvoidance = 5 * time.Second
)

// pool returns the connection pool of the instance at addr, making it on
// first use.
func (c *Client) pool(addr string) (*connPool, error) {
	p := (*c.pools.Load())[addr]
	if p == nil {
		c.poolsMu.Lock()
		if c.closed.Load() {
			c.poolsMu.Unlock()
			return nil, Errorf(Canceled, "client for %q is closed", c.service)
		}
		old := *c.pools.Load()
		if p = old[addr]; p == nil {
			p = &connPool{client: c, addr: addr, conns: make([]*clientConn, c.cfg.Client.PoolSize), dialing: make([]*pendingDial, c.cfg.Client.PoolSize)}
			next := make(map[string]*connPool, len(old)+1)
			for k, v := range old {
				next[k] = v
			}
			next[addr] = p
			c.pools.Store(&next)
		}
		c.poolsMu.Unlock()
	}
	return p, nil
}

// connPool holds the connections to one instance. Calls spread over them;
// each connection multiplexes many calls.
type connPool struct {
	client    *Client
	addr      string
	next      atomic.Uint32
	downUntil atomic.Int64 // unix ns; until then, picks of this instance are passed over

	mu      sync.Mutex
	conns   []*clientConn
	dialing []*pendingDial // per slot, while a dial is under way
	retired bool
}

// pendingDial is a connection being dialled for a pool slot. The dial runs
// on its own goroutine, bounded by dial_timeout and the client's life but
// not by any one caller's deadline: a caller in a hurry gives up waiting,
// and the connection is there for the next one.
type pendingDial struct {
	done chan struct{}
	cc   *clientConn
	err  error
}

func (p *connPool) get(ctx context.Context) (*clientConn, error) {
	i := 0
	if len(p.conns) > 1 {
		i = int(p.next.Add(1) % uint32(len(p.conns)))
	}
	p.mu.Lock()
	if cc := p.conns[i]; cc != nil && cc.usable() {
		p.mu.Unlock()
		return cc, nil
	}
	if p.retired {
		p.mu.Unlock()
		return nil, &Status{Code: Unavailable, Message: "instance " + p.addr + " left the registry", Retryable: true}
	}
	d := p.dialing[i]
	if d == nil {
		d = &pendingDial{done: make(chan struct{})}
		p.dialing[i] = d
		p.client.dials.Add(1)
		go p.dial(i, d)
	}
	p.mu.Unlock()
	select {
	case <-d.done:
		return d.cc, d.err
	case <-ctx.Done():
		return nil, ctxStatus(ctx, "connecting to "+p.addr)
	}
}

// dial connects slot i and tells whoever waits through d.
func (p *connPool) dial(i int, d *pendingDial) {
	c := p.client
	defer c.dials.Done()
	ctx, cancel := context.WithTimeout(c.life, c.dialTimeout)
	defer cancel()
	conn, err := c.transport.Dial(ctx, p.addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer close(d.done)
	p.dialing[i] = nil
	switch {
	case err != nil:
		p.markDown(dialAvoidance)
		// Nothing was sent, so another instance may take the call.
		d.err = &Status{Code: Unavailable, Message: fmt.Sprintf("dial %s with %s: %v", p.addr, c.cfg.Transport.Name, err), Retryable: true}
	case p.retired:
		_ = conn.Close()
		d.err = &Status{Code: Unavailable, Message: "instance " + p.addr + " left the registry", Retryable: true}
	default:
		p.downUntil.Store(0)
		d.cc = &clientConn{conn: conn, pending: make(map[uint64]*callState), log: c.log, pool: p}
		if old := p.conns[i]; old != nil {
			old.retire()
		}
		p.conns[i] = d.cc
	}
}

// avoided reports whether picks of this instance are passed over for now.
func (p *connPool) avoided() bool {
	until := p.downUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

func (p *connPool) markDown(d time.Duration) { p.downUntil.Store(time.Now().Add(d).UnixNano()) }

// retire stops handing out the pool's connections; each closes once its
// last call is answered.
func (p *connPool) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	for _, cc := range p.conns {
		if cc != nil {
			cc.retire()
		}
	}
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	for _, cc := range p.conns {
		if cc != nil {
			cc.fail(fmt.Errorf("client closed: %w", ErrClosed))
		}
	}
}
