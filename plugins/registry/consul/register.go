package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// registration is one instance this registry registered. Its mutex
// serialises the agent writes of the instance (registering, passing its
// check, writing its load, deregistering), so that none lands after the
// instance was deregistered. A write holds it for up to the timeout
// option: a caller waits for it bounded by its own context (lock).
type registration struct {
	id string // Consul service ID

	mu            ctxMutex
	written       bool // registered with the agent at least once: the keeper may pass its check
	gone          bool // deregistered: write nothing more
	inst          kernel.Instance
	ttl           time.Duration
	load          kernel.Load  // last load written into its Meta
	pending       *kernel.Load // a report waiting for the interval to pass
	lastLoadWrite time.Time
	nextPass      time.Time
}

// Register announces inst through the agent, with a TTL check of ttl (the
// ttl option when 0) that the registry passes every ttl/3 until Deregister
// or Close. Registering the same Service and ID again replaces the
// registration; one that fails leaves it as it was, its check passed at
// the cadence of its own ttl.
func (r *Registry) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("consul: register: %w", ctx.Err())
	case inst.Service == "":
		return errors.New("consul: register: instance has an empty Service")
	case inst.ID == "":
		return fmt.Errorf("consul: register %s: instance has an empty ID", inst.Service)
	case inst.Address == "":
		return fmt.Errorf("consul: register %s/%s: instance has an empty Address", inst.Service, inst.ID)
	case ttl < 0:
		return fmt.Errorf("consul: register %s/%s: negative ttl %s", inst.Service, inst.ID, ttl)
	case ttl == 0:
		ttl = r.cfg.ttl
	}
	if err := checkService(inst.Service); err != nil {
		return fmt.Errorf("consul: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	if _, err := encodeMeta(inst, kernel.Load{}); err != nil {
		return fmt.Errorf("consul: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	inst.Metadata = maps.Clone(inst.Metadata)
	id := serviceID(inst.Service, inst.ID)

	reg, existed, err := r.claim(ctx, id)
	if err != nil {
		return fmt.Errorf("consul: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	prevInst, prevTTL := reg.inst, reg.ttl
	reg.inst, reg.ttl = inst, ttl
	err = r.writeRegistration(ctx, reg)
	switch {
	case err == nil:
		reg.written = true
		reg.nextPass = time.Now().Add(ttl / 3)
	case existed:
		// As it was: the agent still has the registration written
		// before, whose check is passed at its own ttl's cadence.
		reg.inst, reg.ttl = prevInst, prevTTL
	default:
		reg.gone = true
	}
	reg.mu.Unlock()
	if err != nil {
		if !existed {
			r.mu.Lock()
			if r.owned[id] == reg {
				delete(r.owned, id)
			}
			r.mu.Unlock()
		}
		return r.fail(fmt.Sprintf("register %s/%s", inst.Service, inst.ID), err)
	}
	r.wakeKeeper()
	return nil
}

// claim returns id's registration in r.owned, made if there is none
// (existed false), with its mu held. A registration a Deregister, Close or
// failed first write marked gone while claim waited for it is (about to
// be) out of r.owned: what Register wrote into it would stay on the agent
// with nobody passing its check or deregistering it, so claim starts over.
func (r *Registry) claim(ctx context.Context, id string) (reg *registration, existed bool, err error) {
	var gone *registration
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil, false, kernel.ErrClosed
		}
		if gone != nil && r.owned[id] == gone {
			// Its Deregister (or failed Register) has yet to take it
			// out; gone it stays, so do it here rather than spin.
			delete(r.owned, id)
		}
		reg, existed = r.owned[id]
		if !existed {
			reg = newRegistration(id, kernel.Instance{})
			r.owned[id] = reg
		}
		r.startKeeperLocked()
		r.mu.Unlock()

		if err := reg.lock(ctx); err != nil {
			// A registration made here and never written stays in
			// r.owned: another Register may be waiting for it. Unwritten,
			// it is neither passed nor reported on, and deregistering it
			// at Close finds nothing.
			return nil, false, fmt.Errorf("waiting for another write of the instance: %w", err)
		}
		if !reg.gone {
			return reg, existed, nil
		}
		reg.mu.Unlock()
		gone = reg
	}
}

// writeRegistration (re)registers reg with the agent; reg.mu is held.
func (r *Registry) writeRegistration(ctx context.Context, reg *registration) error {
	meta, err := encodeMeta(reg.inst, reg.load)
	if err != nil {
		return err
	}
	host, port := hostPort(reg.inst.Address)
	svc := &api.AgentServiceRegistration{
		ID: reg.id, Name: reg.inst.Service, Address: host, Port: port, Meta: meta,
		Check: &api.AgentServiceCheck{
			CheckID:                        checkID(reg.id),
			Name:                           "kernrpc TTL",
			TTL:                            reg.ttl.String(),
			Status:                         api.HealthPassing,
			DeregisterCriticalServiceAfter: r.cfg.deregAfter.String(),
		},
	}
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	return r.client.Agent().ServiceRegisterOpts(svc, api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx))
}

// Deregister removes inst, matched by Service and ID, from the agent and
// stops passing its check. Removing an instance the agent does not have is
// not an error; one that fails leaves the instance as it was: its check
// passed, and Close deregistering it.
func (r *Registry) Deregister(ctx context.Context, inst kernel.Instance) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("consul: deregister: %w", err)
	}
	id := serviceID(inst.Service, inst.ID)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("consul: deregister %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	}
	reg := r.owned[id]
	r.mu.Unlock()
	if reg == nil {
		reg = newRegistration(id, inst)
	}
	op := fmt.Sprintf("deregister %s/%s", inst.Service, inst.ID)
	if err := reg.lock(ctx); err != nil {
		// Still in r.owned, still kept: a deregistration that did not
		// happen leaves nothing half done.
		return fmt.Errorf("consul: %s: waiting for another write of the instance: %w", op, err)
	}
	err := r.deregisterLocked(ctx, op, reg)
	reg.mu.Unlock()
	if err != nil {
		// As it was, as for the caller it is: still registered, its
		// check still passed, and deregistered by Close.
		return err
	}
	// Only now, gone: a Register that found reg meanwhile waited for it,
	// and starts over with a registration of its own.
	r.mu.Lock()
	if r.owned[id] == reg {
		delete(r.owned, id)
	}
	r.mu.Unlock()
	return err
}

// deregisterOwned deregisters reg, which Close took out of r.owned:
// gone, whether the agent answers or not.
func (r *Registry) deregisterOwned(ctx context.Context, reg *registration) error {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	err := r.deregisterLocked(ctx, fmt.Sprintf("deregister %s/%s", reg.inst.Service, reg.inst.ID), reg)
	reg.gone = true
	return err
}

// deregisterLocked removes reg from the agent and marks it gone; reg.mu
// is held. One the agent did not remove is left as it was.
func (r *Registry) deregisterLocked(ctx context.Context, op string, reg *registration) error {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	err := r.client.Agent().ServiceDeregisterOpts(reg.id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil && !notFound(err) {
		return r.fail(op, err)
	}
	reg.gone = true
	return nil
}

// ctxMutex is a mutex whose Lock a caller can give up on (lock).
type ctxMutex chan struct{}

func (m ctxMutex) Lock()   { m <- struct{}{} }
func (m ctxMutex) Unlock() { <-m }

func newRegistration(id string, inst kernel.Instance) *registration {
	return &registration{id: id, inst: inst, mu: make(ctxMutex, 1)}
}

// lock locks reg.mu unless ctx ends first.
func (reg *registration) lock(ctx context.Context) error {
	select {
	case reg.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// ReportLoad writes load into the Meta of an instance this registry
// registered: at once when the last write is load_report_interval old,
// otherwise at the end of the interval, where only the latest report of
// the interval is written (should that write fail, at the end of the next
// interval, and so on). A zero load.Updated is set to now; a load JSON
// cannot carry (a QPS of NaN or ±Inf) is refused.
func (r *Registry) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("consul: report load: %w", err)
	}
	if load.Updated.IsZero() {
		load.Updated = time.Now()
	}
	// Refused at once: a load JSON cannot carry (a QPS of NaN or ±Inf)
	// held for the end of the interval would fail there, again and again,
	// after this call said nil.
	if _, err := json.Marshal(loadDoc{InFlight: load.InFlight, QPS: load.QPS, Updated: load.Updated.UnixMilli()}); err != nil {
		return fmt.Errorf("consul: report load of %s/%s: the load cannot be written: %w", inst.Service, inst.ID, err)
	}
	r.mu.Lock()
	closed, abandoned := r.closed, r.abandoned
	reg := r.owned[serviceID(inst.Service, inst.ID)]
	r.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("consul: report load of %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	case reg == nil:
		return fmt.Errorf("consul: report load of %s/%s: not registered through this registry (the agent takes writes only from who registered; register it first)",
			inst.Service, inst.ID)
	case abandoned:
		return nil // as if dead: nothing is written
	}
	if err := reg.lock(ctx); err != nil {
		return fmt.Errorf("consul: report load of %s/%s: waiting for another write of the instance: %w", inst.Service, inst.ID, err)
	}
	defer reg.mu.Unlock()
	switch {
	case reg.gone:
		return fmt.Errorf("consul: report load of %s/%s: deregistered", inst.Service, inst.ID)
	case !reg.written:
		return fmt.Errorf("consul: report load of %s/%s: its registration has not been written yet (register it first)", inst.Service, inst.ID)
	}
	if now := time.Now(); now.Sub(reg.lastLoadWrite) < r.cfg.loadEvery {
		reg.pending = &load
		r.wakeKeeper()
		return nil
	}
	prev := reg.load
	reg.load, reg.pending, reg.lastLoadWrite = load, nil, time.Now()
	if err := r.writeRegistration(ctx, reg); err != nil {
		reg.load = prev
		return r.fail(fmt.Sprintf("report load of %s/%s", inst.Service, inst.ID), err)
	}
	return nil
}

// startKeeperLocked starts the goroutine that passes TTL checks and writes
// pending loads, once; r.mu is held.
func (r *Registry) startKeeperLocked() {
	if r.keeper != nil || r.abandoned {
		return
	}
	r.keeper = make(chan struct{}, 1)
	wake := r.keeper
	r.goBackground(func() { r.keep(wake) })
}

func (r *Registry) wakeKeeper() {
	r.mu.Lock()
	wake := r.keeper
	r.mu.Unlock()
	if wake == nil {
		return
	}
	select {
	case wake <- struct{}{}:
	default:
	}
}

// keep runs until AbandonLeases or Close: it does what is due, then sleeps
// until the next thing is due or it is woken.
func (r *Registry) keep(wake <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := r.keepOnce(time.Now())
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-r.heartbeat.Done():
			return
		case <-wake:
		case <-timer.C:
		}
	}
}

// keepOnce passes the checks and writes the loads that are due and
// returns when the next is due (zero when nothing is registered).
func (r *Registry) keepOnce(now time.Time) time.Time {
	r.mu.Lock()
	regs := make([]*registration, 0, len(r.owned))
	for _, reg := range r.owned {
		regs = append(regs, reg)
	}
	r.mu.Unlock()
	var next time.Time
	for _, reg := range regs {
		if r.heartbeat.Err() != nil {
			return time.Time{}
		}
		due := r.keepOne(reg, now)
		if !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	return next
}

// keepOne does what is due for reg and returns when it next needs
// something.
func (r *Registry) keepOne(reg *registration, now time.Time) time.Time {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.gone || !reg.written {
		return time.Time{} // Register wakes the keeper once it is
	}
	ctx := r.heartbeat
	if !now.Before(reg.nextPass) {
		reg.nextPass = now.Add(reg.ttl / 3)
		if err := r.pass(ctx, reg); err != nil && ctx.Err() == nil {
			// Try again soon, still well within the ttl.
			reg.nextPass = now.Add(min(reg.ttl/3, max(reg.ttl/10, 100*time.Millisecond)))
			r.log.Warn("consul: passing a TTL check failed; trying again", "service", reg.inst.Service, "id", reg.inst.ID, "err", err)
		}
	}
	next := reg.nextPass
	if reg.pending != nil {
		due := reg.lastLoadWrite.Add(r.cfg.loadEvery)
		if !now.Before(due) {
			prev, held := reg.load, reg.pending
			reg.load, reg.pending, reg.lastLoadWrite = *held, nil, now
			if err := r.writeRegistration(ctx, reg); err != nil && ctx.Err() == nil {
				// Held again, for the next interval: the engine reports a
				// load only when it changes, so a report dropped here
				// would leave the old load published indefinitely.
				reg.load, reg.pending = prev, held
				r.log.Warn("consul: writing a load report failed; trying again at the end of the next interval", "service", reg.inst.Service, "id", reg.inst.ID, "err", err)
			}
			if retry := reg.lastLoadWrite.Add(r.cfg.loadEvery); reg.pending != nil && retry.Before(next) {
				next = retry
			}
		} else if due.Before(next) {
			next = due
		}
	}
	return next
}

// pass passes reg's TTL check. When the agent no longer knows the check
// (it restarted without its state, or reaped the instance after it was
// critical for deregister_critical_service_after), the instance is
// registered again, once: a lost registration is the only thing that
// leads to a second registration write.
func (r *Registry) pass(ctx context.Context, reg *registration) error {
	opCtx, cancel := r.opContext(ctx)
	defer cancel()
	err := r.client.Agent().UpdateTTLOpts(checkID(reg.id), "kernrpc", api.HealthPassing, (&api.QueryOptions{}).WithContext(opCtx))
	if err == nil || !notFound(err) {
		return err
	}
	r.log.Info("consul: the agent lost the instance's check; registering it again", "service", reg.inst.Service, "id", reg.inst.ID)
	return r.writeRegistration(ctx, reg)
}

// notFound reports whether the agent answered that it has no such service
// or check: 404 in current Consul, 500 with these words in older ones.
func notFound(err error) bool {
	var se api.StatusError
	if !errors.As(err, &se) {
		return false
	}
	return se.Code == 404 || strings.Contains(se.Body, "does not have associated TTL") ||
		strings.Contains(se.Body, "Unknown check") || strings.Contains(se.Body, "Unknown service")
}
