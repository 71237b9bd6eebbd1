package consul

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// registration is one instance this registry registered. Its mutex
// serialises the agent writes of the instance (registering, passing its
// check, writing its load, deregistering), so that none lands after the
// instance was deregistered.
type registration struct {
	id string // Consul service ID

	mu            sync.Mutex
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
// registration.
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

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("consul: register %s/%s: %w", inst.Service, inst.ID, kernel.ErrClosed)
	}
	reg, existed := r.owned[id]
	if !existed {
		reg = &registration{id: id}
		r.owned[id] = reg
	}
	r.startKeeperLocked()
	r.mu.Unlock()

	reg.mu.Lock()
	reg.inst, reg.ttl = inst, ttl
	err := r.writeRegistration(ctx, reg)
	reg.nextPass = time.Now().Add(ttl / 3)
	if err == nil {
		reg.written = true
	} else if !existed {
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
// not an error.
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
	delete(r.owned, id)
	r.mu.Unlock()
	if reg == nil {
		reg = &registration{id: id, inst: inst}
	}
	return r.deregisterOwned(ctx, reg)
}

func (r *Registry) deregisterOwned(ctx context.Context, reg *registration) error {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.gone = true
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	err := r.client.Agent().ServiceDeregisterOpts(reg.id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil && !notFound(err) {
		return r.fail(fmt.Sprintf("deregister %s/%s", reg.inst.Service, reg.inst.ID), err)
	}
	return nil
}

// ReportLoad writes load into the Meta of an instance this registry
// registered: at once when the last write is load_report_interval old,
// otherwise at the end of the interval, where only the latest report of
// the interval is written. A zero load.Updated is set to now.
func (r *Registry) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("consul: report load: %w", err)
	}
	if load.Updated.IsZero() {
		load.Updated = time.Now()
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
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.gone {
		return fmt.Errorf("consul: report load of %s/%s: deregistered", inst.Service, inst.ID)
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
			prev := reg.load
			reg.load, reg.pending, reg.lastLoadWrite = *reg.pending, nil, now
			if err := r.writeRegistration(ctx, reg); err != nil && ctx.Err() == nil {
				reg.load = prev
				r.log.Warn("consul: writing a load report failed; the next report will try again", "service", reg.inst.Service, "id", reg.inst.ID, "err", err)
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
