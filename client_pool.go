package kernrpc

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// pool returns the connection pool of the instance at addr, making it on
// first use.
func (c *Client) pool(addr string) (*connPool, error) {
	p := (*c.pools.Load())[addr]
	if p == nil {
		c.poolsMu.Lock()
		if c.closed.Load() {
			c.poolsMu.Unlock()
			return nil, c.closedStatus()
		}
		old := *c.pools.Load()
		if p = old[addr]; p == nil && !lists(c.listed, addr) {
			// The balancer picked the instance before the registry's report
			// that it left, which dropped its pool: a pool made now would be
			// kept until the next report, holding a connection to it. The
			// call gets what one that found the dropped pool gets, and is
			// sent again to an instance still listed.
			c.poolsMu.Unlock()
			p = newConnPool(c, addr)
			p.retire()
			return p, nil
		}
		if p == nil {
			p = newConnPool(c, addr)
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

// lists reports whether an instance of insts is at addr.
func lists(insts []kernel.Instance, addr string) bool {
	for i := range insts {
		if insts[i].Address == addr {
			return true
		}
	}
	return false
}

// closedStatus is what a call gets from a client once Close has begun.
func (c *Client) closedStatus() error {
	return kernel.Errorf(kernel.Canceled, "client for %q is closed", c.service)
}

// connPool holds the connections to one instance. Calls take the first
// fixed slots in turn; each connection multiplexes many calls. The slots
// past those are opened only when calls carry so much that a connection
// they would take is loaded with spreadAt bytes or more
// (client.max_pool_size).
type connPool struct {
	client   *Client
	addr     string
	fixed    int // pool_size: the slots calls take in turn
	spreadAt int64
	next     atomic.Uint32
	down     holdOff // picks of this instance are passed over while it lasts

	mu      sync.Mutex
	conns   []*clientConn
	dialing []*pendingDial // per slot, while a dial is under way
	retired bool
	// life ends when the pool is retired or closed: it bounds the pool's
	// dials, so that a dial to an instance that left ends then, and its
	// callers go to another.
	life    context.Context
	endLife context.CancelFunc
	// replaced are connections a new one took the slot of (they heard a
	// GoAway, say) while they still carried calls or streams: they close
	// once those end, and until then Close must end them and the
	// connection count include them, as for those in slots.
	replaced []*clientConn
	// noSpread holds off dialling for spreading after such a dial failed:
	// the instance still serves on the connections it has.
	noSpread holdOff
}

// holdOff is a span of time from now during which something is not done.
type holdOff struct{ until atomic.Int64 } // unix ns; 0: none

// start holds off for d from now, or for longer if a span under way
// already lasts longer: a refused dial's second must not cut short the
// five a shutdown GoAway started.
func (h *holdOff) start(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		old := h.until.Load()
		if old >= until || h.until.CompareAndSwap(old, until) {
			return
		}
	}
}

func (h *holdOff) end() { h.until.Store(0) }

// on reports whether the span lasts, reading the clock only if one was
// started.
func (h *holdOff) on() bool {
	until := h.until.Load()
	return until != 0 && time.Now().UnixNano() < until
}

func newConnPool(c *Client, addr string) *connPool {
	n := c.cfg.Client.poolLimit()
	life, endLife := context.WithCancel(c.life)
	return &connPool{
		client: c, addr: addr,
		fixed:    c.cfg.Client.PoolSize,
		spreadAt: int64(c.cfg.Client.SpreadBytes),
		conns:    make([]*clientConn, n),
		dialing:  make([]*pendingDial, n),
		life:     life, endLife: endLife,
	}
}

// pendingDial is a connection being dialled for a pool slot. The caller
// that finds the slot empty dials it on its own goroutine, which spares a
// goroutine, its wake-up and the caller's wake-up back: a client made for
// one call pays those on every call (BenchmarkShortCall, and the harness's
// short mode, whose callers' contexts can be canceled). Callers that come
// meanwhile wait for that dial or for their own end, whichever is first.
// The dial is bounded by dial_timeout and the pool's life (it ends when
// the instance leaves the registry, or the client closes), and by the
// dialling caller's context: should that caller give up first, the dial
// starts again on a goroutine of its own (see connPool.dial), so that a
// hurried caller never leaves the next one without a connection.
type pendingDial struct {
	done chan struct{}
	cc   *clientConn
	err  error
}

func (p *connPool) get(ctx context.Context, cs *callState) (*clientConn, error) {
	i := 0
	if p.fixed > 1 {
		i = int(p.next.Add(1) % uint32(p.fixed))
	}
	p.mu.Lock()
	if cc := p.conns[i]; cc != nil && cc.usable() {
		if len(p.conns) > p.fixed && cc.inflight.Load() >= p.spreadAt {
			cc = p.spreadLocked(cc)
		}
		p.mu.Unlock()
		return cc, nil
	}
	if p.retired {
		p.mu.Unlock()
		return nil, &kernel.Status{Code: kernel.Unavailable, Message: "instance " + p.addr + " left the registry", Retryable: true}
	}
	d := p.dialing[i]
	if d == nil {
		d = &pendingDial{done: make(chan struct{})}
		p.dialing[i] = d
		p.client.dials.Add(1)
		p.mu.Unlock()
		return p.dialFor(ctx, cs, i, d)
	}
	p.mu.Unlock()
	select {
	case <-d.done:
		return d.cc, d.err
	case <-engineDone(ctx):
		return nil, p.client.ctxStatus(ctx, cs, "while connecting to "+p.addr)
	}
}

// dialFor dials slot i on the goroutine of the caller whose ctx it is. If
// ctx ends before the dial does, the caller gets its status and the dial
// starts over without it.
func (p *connPool) dialFor(ctx context.Context, cs *callState, i int, d *pendingDial) (*clientConn, error) {
	cs.waited() // a dial may take up to dial_timeout
	conn, err := p.connect(ctx)
	if err != nil && ended(ctx) {
		go p.dial(i, d)
		return nil, p.client.ctxStatus(ctx, cs, "while connecting to "+p.addr)
	}
	p.settle(i, d, conn, err)
	return d.cc, d.err
}

// spreadLocked returns the least loaded usable connection, cc or another.
// When even that one has spreadAt bytes or more in flight, it dials the
// first free slot past the fixed ones in the background: the call does
// not wait for it, later ones use it.
func (p *connPool) spreadLocked(cc *clientConn) *clientConn {
	best, load := cc, cc.inflight.Load()
	free := -1
	for j, o := range p.conns {
		if o == nil || !o.usable() {
			if free < 0 && j >= p.fixed && p.dialing[j] == nil {
				free = j
			}
		} else if l := o.inflight.Load(); l < load {
			best, load = o, l
		}
	}
	if load >= p.spreadAt && free >= 0 && !p.retired && !p.noSpread.on() {
		d := &pendingDial{done: make(chan struct{})}
		p.dialing[free] = d
		p.client.dials.Add(1)
		go p.dial(free, d)
	}
	return best
}

// dial connects slot i on a goroutine of its own and tells whoever waits
// through d.
func (p *connPool) dial(i int, d *pendingDial) {
	conn, err := p.connect(context.Background())
	p.settle(i, d, conn, err)
}

// connect dials the pool's instance within dial_timeout and the pool's
// life (the client's, until the instance leaves), and within ctx too
// when ctx can end sooner: its deadline, which the dial's context then
// carries, and its cancellation. Transports
// honour both (plugintest's Dial/NotAccepted and NotAcceptedCancelled),
// so a caller dialling is held no longer than its context allows.
func (p *connPool) connect(ctx context.Context) (kernel.Conn, error) {
	c := p.client
	parent, byCaller := p.life, !waitsOutDial(ctx, c.dialTimeout)
	if byCaller {
		parent = ctx
	}
	dctx, cancel := context.WithTimeout(parent, c.dialTimeout)
	defer cancel()
	if byCaller {
		defer context.AfterFunc(p.life, cancel)()
	}
	return c.transport.Dial(dctx, p.addr)
}

// ended reports whether ctx is over, its deadline included: a transport
// that dials by the deadline the dial's context carries may fail a moment
// before the timer that ends ctx has run.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// settle ends d with the outcome of its dial, conn or err, putting conn in
// slot i.
func (p *connPool) settle(i int, d *pendingDial, conn kernel.Conn, err error) {
	c := p.client
	defer c.dials.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	defer close(d.done)
	p.dialing[i] = nil
	switch {
	case c.closed.Load():
		// Close ended the dial (the client's life bounds it): that, not
		// the instance, is why it failed. A dial that connected all the
		// same, as Close began, is of no use either.
		if err == nil {
			_ = conn.Close()
		}
		d.err = c.closedStatus()
	case p.retired:
		// The instance left the registry, which ended the dial, or it
		// connected all the same: either way, the call goes elsewhere.
		if err == nil {
			_ = conn.Close()
		}
		d.err = &kernel.Status{Code: kernel.Unavailable, Message: "instance " + p.addr + " left the registry", Retryable: true}
	case err != nil && i >= p.fixed:
		// A dial to spread load: calls still have the fixed connections.
		p.noSpread.start(dialAvoidance)
		d.err = err
	case err != nil:
		p.markDown(dialAvoidance)
		// Nothing was sent, so another instance may take the call.
		d.err = &kernel.Status{Code: kernel.Unavailable, Message: dialFailure(c.cfg.Transport.Name, p.addr, err), Retryable: true}
	default:
		if i < p.fixed {
			// The instance takes connections again. A spare's does not
			// say so: it speaks for no instance (its failed dial does not
			// pass the instance over), and one under way as a GoAway came
			// may connect to a server that is shutting down.
			p.down.end()
		}
		d.cc = &clientConn{conn: conn, pending: make(map[uint64]*attempt), log: &c.log, headroom: &c.headroom, pool: p, spare: i >= p.fixed,
			idle: idleReading{seen: unlooked}}
		if old := p.conns[i]; old != nil {
			old.retire()
			p.keepReplacedLocked(old)
		}
		p.conns[i] = d.cc
	}
}

// keepReplacedLocked holds on to old, which has left its slot, while it
// is open, dropping the replaced connections that closed meanwhile.
func (p *connPool) keepReplacedLocked(old *clientConn) {
	kept := p.replaced[:0]
	for _, cc := range p.replaced {
		if cc.isOpen() {
			kept = append(kept, cc)
		}
	}
	clear(p.replaced[len(kept):])
	p.replaced = kept
	if old.isOpen() {
		p.replaced = append(p.replaced, old)
	}
}

// everyConnLocked yields the pool's connections, in a slot or replaced;
// p.mu is held.
func (p *connPool) everyConnLocked() iter.Seq[*clientConn] {
	return func(yield func(*clientConn) bool) {
		for _, conns := range [...][]*clientConn{p.conns, p.replaced} {
			for _, cc := range conns {
				if cc != nil && !yield(cc) {
					return
				}
			}
		}
	}
}

// avoided reports whether picks of this instance are passed over for now.
func (p *connPool) avoided() bool { return p.down.on() }

func (p *connPool) markDown(d time.Duration) { p.down.start(d) }

// retire stops handing out the pool's connections; each closes once its
// last call is answered.
func (p *connPool) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	p.endLife()
	for _, cc := range p.conns {
		if cc != nil {
			cc.retire()
		}
	}
}

// open counts the pool's connections that are open, and of those the
// spares, dialled to spread large calls. One that takes no new calls (a
// GoAway, a retired pool) is still held while it carries calls or
// streams, and counts until it closes.
func (p *connPool) open() (n, spare int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for cc := range p.everyConnLocked() {
		if cc.isOpen() {
			n++
			if cc.spare {
				spare++
			}
		}
	}
	return n, spare
}

// carries reports whether a connection of the pool, in a slot or
// replaced, is still open.
func (p *connPool) carries() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for cc := range p.everyConnLocked() {
		if cc.isOpen() {
			return true
		}
	}
	return false
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	p.endLife()
	for cc := range p.everyConnLocked() {
		cc.fail(fmt.Errorf("client closed: %w", kernel.ErrClosed))
	}
	p.replaced = nil
}

// dialFailure says why a dial failed, naming the transport and the address
// once each.
func dialFailure(transport, addr string, err error) string {
	msg := (&kernel.PluginError{Kind: kernel.KindTransport, Name: transport, Err: err}).Detail()
	if !strings.Contains(msg, addr) {
		plugin := string(kernel.KindTransport) + " " + strconv.Quote(transport) + ": "
		msg = plugin + "dial " + addr + ": " + strings.TrimPrefix(msg, plugin)
	}
	return msg
}
