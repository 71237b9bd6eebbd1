package kernrpc

import (
	"context"
	"math"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// startLoadReports publishes the server's load into its registration every
// load_report_interval, where the registry takes load reports. A load equal
// to the last one written is not written again, so an idle instance costs
// the registry nothing.
func (s *Server) startLoadReports() {
	lr, ok := s.registry.(kernel.LoadReporter)
	every := s.cfg.Server.LoadReportInterval.D()
	if !ok || every <= 0 || s.cfg.Service == "" {
		return
	}
	s.loadDone = make(chan struct{})
	ctx, stop := context.WithCancel(s.baseCtx)
	s.stopLoad = stop
	go func() {
		defer close(s.loadDone)
		s.reportLoads(ctx, lr, every)
	}()
}

// stopLoadReports stops the reporter and waits for it, or until ctx ends.
// A report still being written then holds the registry lock, so it cannot
// land after the deregistration.
func (s *Server) stopLoadReports(ctx context.Context) {
	if s.loadDone == nil {
		return
	}
	s.stopLoad()
	select {
	case <-s.loadDone:
	case <-ctx.Done():
	}
}

func (s *Server) reportLoads(ctx context.Context, lr kernel.LoadReporter, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	// last is the load the registration holds: none when registered, then
	// each one written. A registration made again (SetServingStatus)
	// writes the instance with no load, so last starts over with it.
	var last kernel.Load
	lastReg := s.health.registrations.Load()
	lastCount, lastAt := s.completed.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// The clock, not the tick's time: a tick that waited while a
			// report was being written carries the time it was due, and
			// the calls counted now ended over all the time since.
			now := time.Now()
			count := s.completed.Load()
			load := kernel.Load{
				InFlight: s.inflight.Load(),
				QPS:      float64(count-lastCount) / now.Sub(lastAt).Seconds(),
				Updated:  now,
			}
			lastCount, lastAt = count, now
			if reg := s.health.registrations.Load(); reg != lastReg {
				last, lastReg = kernel.Load{}, reg
			}
			if sameLoad(load, last) {
				continue
			}
			reg, err := s.reportLoad(ctx, lr, load)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("load report failed; trying again at the next interval", "registry", s.cfg.Registry.Name, "err", err)
				}
				continue
			}
			if reg == lastReg {
				last = load
			}
		}
	}
}

// reportLoad writes load, unless the instance is out of the registry (its
// health says it is not serving): a report must not register it again.
// reg is the registration the load was written into (see
// health.registrations); one of none when the instance is out.
func (s *Server) reportLoad(ctx context.Context, lr kernel.LoadReporter, load kernel.Load) (reg uint64, err error) {
	if err := s.lockRegistry(ctx); err != nil {
		return 0, err
	}
	defer s.unlockRegistry()
	if !s.health.advertised {
		return 0, nil
	}
	return s.health.registrations.Load(), lr.ReportLoad(ctx, s.Instance(), load)
}

// sameLoad is whether a new load is not worth a registry write: the same
// in-flight count and a QPS within 5% of the one reported.
func sameLoad(a, b kernel.Load) bool {
	if a.InFlight != b.InFlight {
		return false
	}
	if a.QPS == b.QPS {
		return true
	}
	return math.Abs(a.QPS-b.QPS) <= 0.05*math.Max(a.QPS, b.QPS)
}
