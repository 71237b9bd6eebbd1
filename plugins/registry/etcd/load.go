package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// ReportLoad sets the load of inst (matched by Service and ID), which this
// registry must have registered, and writes its value again under the same
// lease, at most once per load_report_interval: a report sooner than that
// after the last write is coalesced, and the latest load is written when
// the interval ends (should that write fail, at the end of the next
// interval, and so on). A zero load.Updated is set to now; a load JSON
// cannot carry (a QPS of NaN or ±Inf) is refused. While the lease is
// lost nothing is written; the re-registration carries the latest load.
func (r *Registry) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	what := fmt.Sprintf("report load of %s/%s", inst.Service, inst.ID)
	if err := r.usable(ctx, what); err != nil {
		return err
	}
	if load.Updated.IsZero() {
		load.Updated = time.Now()
	}
	// Refused before it is kept: a load JSON cannot carry (a QPS of NaN or
	// ±Inf, a year past 9999) would make every later write of the
	// instance fail, and with it every re-registration of them all.
	if _, err := json.Marshal(recordLoad{InFlight: load.InFlight, QPS: load.QPS, Updated: load.Updated}); err != nil {
		return fmt.Errorf("%s: %s: the load cannot be written: %w", Name, what, err)
	}
	return r.keeper.reportLoad(ctx, what, instanceKey{inst.Service, inst.ID}, load)
}

func (k *leaseKeeper) reportLoad(ctx context.Context, what string, key instanceKey, load kernel.Load) error {
	if err := k.lockCtx(ctx, what); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if k.stopped {
		return k.stoppedError(what)
	}
	o := k.owned[key]
	if o == nil {
		return fmt.Errorf("%s: %s: this registry has not registered it (register it through the same registry first)", Name, what)
	}
	o.inst.Load = load
	if o.flush != nil {
		o.pending = true // the timer writes the latest
		return nil
	}
	if k.id == 0 {
		return nil // lost: the re-registration writes it
	}
	interval := k.r.opts.LoadReportInterval.D()
	if since := time.Since(o.lastWrite); since < interval {
		o.pending = true
		o.flush = time.AfterFunc(interval-since, func() { k.flushLoad(key, o) })
		return nil
	}
	return k.putLocked(ctx, what, o)
}

// flushLoad writes the load reported during the interval that just ended.
func (k *leaseKeeper) flushLoad(key instanceKey, o *ownedInstance) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || k.owned[key] != o || o.flush == nil {
		return // deregistered, replaced or closed meanwhile
	}
	o.flush = nil
	if !o.pending || k.id == 0 {
		return
	}
	o.pending = false
	what := fmt.Sprintf("report load of %s/%s", key.service, key.id)
	if err := k.putLocked(k.r.ctx, what, o); err != nil {
		if k.r.ctx.Err() != nil {
			return // closed
		}
		// Held again, for the next interval: the engine reports a load
		// only when it changes, so a report dropped here would leave the
		// old load in etcd indefinitely.
		o.pending = true
		o.flush = time.AfterFunc(k.r.opts.LoadReportInterval.D(), func() { k.flushLoad(key, o) })
		k.r.log.Warn("etcd: writing a coalesced load report failed; trying again at the end of the next interval", "err", err)
	}
}
