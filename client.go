package kernrpc

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Client calls one service: it resolves instances through the registry,
// picks one per attempt with the balancer, keeps a pool of multiplexed
// connections per instance, and runs the client's call filters around
// every call and its attempt filters around every attempt. It is safe for
// concurrent use; share one per service.
type Client struct {
	cfg       *Config
	service   string
	log       lazyLogger
	transport kernel.Transport
	codec     kernel.Codec
	registry  kernel.Registry
	balancer  kernel.Balancer
	plugins   *plugins
	headroom  headroomHold
	// callChains and attemptChains are nil when no filter runs in that
	// stage: the call then costs no chain at all.
	callChains    *filterChains
	attemptChains *filterChains
	// deadliners are the filters of either stage that give calls without
	// a deadline one (kernel.Deadliner), in the order they run.
	deadliners []configuredFilter

	pools           atomic.Pointer[map[string]*connPool]
	instances       atomic.Int64                  // in the registry's last report, for clientState
	registryUpdates atomic.Int64                  // registry reports applied, the first set too, for clientState
	streamsOpen     atomic.Int64                  // streams open on the client's connections, for clientState
	poolsMu         sync.Mutex                    // serialises copy-on-write updates of pools
	updated         atomic.Pointer[chan struct{}] // closed at the registry's next report
	closed          atomic.Bool
	followMu        sync.Mutex // serialises applying registry reports
	stopWatch       func()
	watchDone       chan struct{}   // closed once nothing follows the registry
	life            context.Context // ends with Close: bounds background dials
	endLife         context.CancelFunc
	dials           sync.WaitGroup
	// filtered holds the streams whose filters run on a goroutine of
	// their own (runFilters), and filtering counts those goroutines:
	// Close ends the streams and waits for their filters before it closes
	// the plugins, which a filter's last act (a span's end) may need.
	filteredMu  sync.Mutex
	filtered    map[*ClientStream]struct{}
	filtering   sync.WaitGroup
	sweepMu     sync.Mutex                 // held by each look for idle connections
	sweep       atomic.Pointer[time.Timer] // the next look (sweepIdle); nil until startIdleSweep
	calls       sync.Pool                  // *callState
	attempts    sync.Pool                  // *attempt
	dialTimeout time.Duration

	// retired are the pools of instances that left the registry whose
	// connections may still carry calls or streams (they close once
	// idle): Close ends those too. Under poolsMu.
	retired map[*connPool]struct{}
	// listed is the registry's last report, under poolsMu: a pool is made
	// only for an instance it lists (see pool).
	listed []kernel.Instance
}

// NewClient builds a client for service (cfg.Service when empty) from cfg.
// It resolves the service once before returning, then follows the
// registry's watch; a call made before any instance is known waits for
// the first one, up to its deadline. The client keeps a copy of cfg's
// settings: changing cfg afterwards (to make another client) leaves this
// one as it was made.
func NewClient(cfg *Config, service string) (*Client, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	cfg.applyDefaults()
	if err := cfg.validateFields(); err != nil {
		return nil, err
	}
	// The client's own copy: it reads its options for as long as it
	// lives (a pool's sizes on the first call to each instance), and a
	// program may go on to change cfg for another client.
	own := *cfg
	retries := *cfg.Client.Retries
	own.Client.Retries = &retries
	cfg = &own
	if service == "" {
		service = cfg.Service
	}
	if service == "" {
		return nil, errors.New("kernrpc: NewClient: no service to call: pass its name or set service in the config")
	}
	c := &Client{
		cfg:         cfg,
		service:     service,
		log:         lazyLogger{base: slog.Default(), args: []any{"component", "kernrpc.client", "service", service}},
		watchDone:   make(chan struct{}),
		dialTimeout: cfg.Client.DialTimeout.D(),
	}
	c.calls.New = func() any { return new(callState) }
	c.attempts.New = func() any { return &attempt{wake: make(chan struct{}, 1)} }
	empty := map[string]*connPool{}
	c.pools.Store(&empty)
	first := make(chan struct{})
	c.updated.Store(&first)
	ps, err := buildPlugins(cfg, kernel.ClientSide)
	if err != nil {
		return nil, err
	}
	c.plugins = ps
	c.headroom = headroomHold{size: int(*cfg.GCHeadroom), log: c.log.get}
	c.transport, c.codec, c.registry, c.balancer = ps.transport, ps.codec, ps.registry, ps.balancer
	if len(ps.callFilters) > 0 {
		c.callChains = newFilterChains(ps.callFilters, c.attemptFromChain)
	}
	if len(ps.attemptFilters) > 0 {
		c.attemptChains = newFilterChains(ps.attemptFilters, c.sendFromChain)
	}
	c.deadliners = append(deadliners(ps.callFilters), deadliners(ps.attemptFilters)...)
	defer func() {
		if err != nil {
			ps.close(c.log.get)
		}
	}()
	ps.observePlugins(kernel.ClientSide, clientState{c})

	ctx, cancel := context.WithTimeout(context.Background(), c.dialTimeout)
	defer cancel()
	if err = c.followRegistry(ctx); err != nil {
		return nil, err
	}
	c.life, c.endLife = context.WithCancel(context.Background())
	return c, nil
}

// Close closes every connection (calls in flight fail with Unavailable),
// those that still carried calls or streams after they stopped taking
// new ones (a GoAway, an instance that left the registry) included, and
// the plugins the client built, once the stream filters of every stream,
// each ended by now, have returned (for at most 5 s: a span's end, say,
// needs the plugin still open). Dials under way end at once; calls
// waiting for them or for the registry to report an instance, and later
// calls, fail with Canceled ("client … is closed"). It is idempotent.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.endLife()
	c.stopWatch()
	c.poolsMu.Lock()
	for _, p := range *c.pools.Load() {
		p.close()
	}
	for p := range c.retired {
		p.close()
	}
	c.retired = nil
	empty := map[string]*connPool{}
	c.pools.Store(&empty)
	c.poolsMu.Unlock()
	c.dials.Wait()
	c.endFilteredStreams()
	c.stopIdleSweep()
	// A Watch ends while the connections close; a report that comes
	// meanwhile finds no pools to drop. The plugins close once reports
	// have stopped (a Notify's stop waits for the one in progress), so
	// none feeds a closed balancer.
	<-c.watchDone
	c.plugins.close(c.log.get)
	c.headroom.release()
	return nil
}

// Plugins lists the plugins this client built from its config, so that
// code can reach them (a filter's counters, say); see FindPlugin.
func (c *Client) Plugins() []BuiltPlugin { return c.plugins.list() }

// Call sends req to method and waits for the answer, which it decodes into
// resp. The context's deadline and cancellation reach the server; metadata
// attached with WithMetadata travels with the request. A failed call
// returns a *kernel.Status.
func (c *Client) Call(ctx context.Context, method string, req, resp any, opts ...CallOption) error {
	_, err := c.callWith(ctx, method, req, resp, opts)
	return err
}

// callWith is call with call options applied.
func (c *Client) callWith(ctx context.Context, method string, req, resp any, opts []CallOption) (kernel.Metadata, error) {
	if len(opts) == 0 {
		return c.call(ctx, method, req, resp)
	}
	ctx, o, done := applyCallOptions(ctx, opts)
	defer done()
	md, err := c.call(ctx, method, req, resp)
	if o.response != nil {
		*o.response = md
	}
	return md, err
}

// Call is an asynchronous call in progress (see Client.Go).
type Call struct {
	Method   string
	Request  any
	Response any
	// ResponseMetadata is what the server sent back with its answer.
	ResponseMetadata kernel.Metadata
	// Err is the call's outcome, set before the call is sent on Done.
	Err error
	// Done receives the call when it completes.
	Done chan *Call
}

// Go starts a call and returns at once; the call is sent on done (or on a
// new channel if done is nil) when it completes, as net/rpc does. done must
// have room: Go panics on an unbuffered channel.
func (c *Client) Go(ctx context.Context, method string, req, resp any, done chan *Call, opts ...CallOption) *Call {
	if done == nil {
		done = make(chan *Call, 1)
	} else if cap(done) == 0 {
		panic("kernrpc: Client.Go: done channel is unbuffered")
	}
	call := &Call{Method: method, Request: req, Response: resp, Done: done}
	go func() {
		call.ResponseMetadata, call.Err = c.callWith(ctx, method, req, resp, opts)
		call.Done <- call
	}()
	return call
}

// CallFunc starts a call and returns at once; fn runs with the finished call
// on a goroutine of its own.
func (c *Client) CallFunc(ctx context.Context, method string, req, resp any, fn func(*Call), opts ...CallOption) {
	call := &Call{Method: method, Request: req, Response: resp}
	go func() {
		call.ResponseMetadata, call.Err = c.callWith(ctx, method, req, resp, opts)
		fn(call)
	}()
}

// CallWithMetadata is Call that also returns the response metadata.
func (c *Client) CallWithMetadata(ctx context.Context, method string, req, resp any, opts ...CallOption) (kernel.Metadata, error) {
	return c.callWith(ctx, method, req, resp, opts)
}
