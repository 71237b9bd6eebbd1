package prometheus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/kernrpc/kernrpc/kernel"
)

// The label names, in the order the vectors take their values.
const (
	labelService = "service"
	labelMethod  = "method"
	labelCode    = "code"
)

// otherMethod labels the calls of methods past max_methods.
const otherMethod = "_other"

// sideFamilies are the metric families of one side. The families are
// separate per side (kernrpc_client_*, kernrpc_server_*), not a side
// label, because a call measured at both ends would otherwise be summed
// twice by sum(), and because the sides know different things (only the
// client sees the response's size and the attempts).
type sideFamilies struct {
	calls     *prom.CounterVec   // service, method, code
	duration  *prom.HistogramVec // service, method
	inFlight  *prom.GaugeVec     // service, method
	reqBytes  *prom.CounterVec   // service, method
	respBytes *prom.CounterVec   // service, method; client only
	attempts  *prom.CounterVec   // service, method; client only
}

// families are the filter's metric families, registered in its registry.
type families struct {
	client, server sideFamilies
}

func newFamilies(reg prom.Registerer, buckets []float64, native bool) (*families, error) {
	f := &families{}
	var err error
	for _, s := range []struct {
		side kernel.Side
		fam  *sideFamilies
	}{{kernel.ClientSide, &f.client}, {kernel.ServerSide, &f.server}} {
		if err = newSideFamilies(reg, s.side, s.fam, buckets, native); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func newSideFamilies(reg prom.Registerer, side kernel.Side, f *sideFamilies, buckets []float64, native bool) error {
	ns, sub := "kernrpc", side.String()
	sm := []string{labelService, labelMethod}
	var err error
	counter := func(name, help string, labels []string) *prom.CounterVec {
		c, e := register(reg, prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels))
		err = errors.Join(err, e)
		return c
	}
	who := map[kernel.Side]string{kernel.ClientSide: "made", kernel.ServerSide: "handled"}[side]
	f.calls = counter("calls_total", "Calls "+who+", by service, method and status code.", []string{labelService, labelMethod, labelCode})
	f.reqBytes = counter("request_bytes_total", "Encoded size of the requests of the calls "+who+", in bytes.", sm)
	if side == kernel.ClientSide {
		f.respBytes = counter("response_bytes_total", "Encoded size of the responses received, in bytes.", sm)
		f.attempts = counter("attempts_total", "Attempts the calls made took, retries and hedges included.", sm)
	}
	ho := prom.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "call_duration_seconds",
		Help:    "Time from the start of a call to its outcome, as this side measures it, in seconds.",
		Buckets: buckets,
	}
	if native {
		// About 10% wide buckets; bounded in number, and reset at most
		// hourly when the bound is hit, as client_golang advises.
		ho.NativeHistogramBucketFactor = 1.1
		ho.NativeHistogramMaxBucketNumber = 160
		ho.NativeHistogramMinResetDuration = time.Hour
	}
	var e error
	f.duration, e = register(reg, prom.NewHistogramVec(ho, sm))
	err = errors.Join(err, e)
	f.inFlight, e = register(reg, prom.NewGaugeVec(prom.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "calls_in_flight",
		Help: "Calls " + map[kernel.Side]string{kernel.ClientSide: "made", kernel.ServerSide: "being handled"}[side] + " that have not ended yet.",
	}, sm))
	return errors.Join(err, e)
}

// register registers c, or returns the collector already registered under
// the same name and labels (another filter in the default registry).
func register[C prom.Collector](reg prom.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prom.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("registering the call metrics: %w", err)
}

// methodMetrics are one method's metrics on one side, resolved once.
type methodMetrics struct {
	service, method string
	calls           *prom.CounterVec
	codes           [kernel.Unauthenticated + 1]atomic.Pointer[prom.Counter]
	duration        prom.Observer
	inFlight        prom.Gauge
	reqBytes        prom.Counter
	respBytes       prom.Counter // nil on the server
	attempts        prom.Counter // nil on the server
}

func newMethodMetrics(f *sideFamilies, service, method string) *methodMetrics {
	m := &methodMetrics{
		service:  service,
		method:   method,
		calls:    f.calls,
		duration: f.duration.WithLabelValues(service, method),
		inFlight: f.inFlight.WithLabelValues(service, method),
		reqBytes: f.reqBytes.WithLabelValues(service, method),
	}
	if f.respBytes != nil {
		m.respBytes = f.respBytes.WithLabelValues(service, method)
		m.attempts = f.attempts.WithLabelValues(service, method)
	}
	return m
}

// callsWith is the calls counter of one code, resolved on its first use:
// a method has series only for the codes it ended with.
func (m *methodMetrics) callsWith(c kernel.Code) prom.Counter {
	if int(c) >= len(m.codes) {
		c = kernel.Unknown // a code from a newer peer: as gRPC does, Unknown
	}
	if p := m.codes[c].Load(); p != nil {
		return *p
	}
	ctr := m.calls.WithLabelValues(m.service, m.method, c.String())
	m.codes[c].CompareAndSwap(nil, &ctr) // a racing first call resolved the same child
	return ctr
}

// methodTable maps one side's method names to their metrics. Readers load
// the map without a lock; a new method copies it under mu, which only
// first calls of a method take.
type methodTable struct {
	fam   *sideFamilies
	max   int
	byKey atomic.Pointer[map[string]*methodMetrics]
	full  atomic.Bool // max reached: unknown methods go to other, lock-free
	other atomic.Pointer[methodMetrics]
	mu    sync.Mutex
}

func (t *methodTable) init(side kernel.Side, f *families, max int) {
	switch side {
	case kernel.ClientSide:
		t.fam = &f.client
	case kernel.ServerSide:
		t.fam = &f.server
	}
	t.max = max
	empty := map[string]*methodMetrics{}
	t.byKey.Store(&empty)
}

// get returns the metrics of a method, resolving them on its first call.
func (t *methodTable) get(method string) *methodMetrics {
	if m := (*t.byKey.Load())[method]; m != nil {
		return m
	}
	if t.full.Load() {
		return t.other.Load()
	}
	return t.add(method)
}

func (t *methodTable) add(method string) *methodMetrics {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.byKey.Load()
	if m := old[method]; m != nil {
		return m
	}
	if len(old) >= t.max {
		if t.other.Load() == nil {
			t.other.Store(newMethodMetrics(t.fam, otherMethod, otherMethod))
		}
		t.full.Store(true)
		return t.other.Load()
	}
	service, name := splitMethod(method)
	m := newMethodMetrics(t.fam, service, name)
	next := make(map[string]*methodMetrics, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[strings.Clone(method)] = m // the caller's string may be a connection's interned name
	t.byKey.Store(&next)
	return m
}

// splitMethod splits a method name into the service and method labels:
// "Echo.Say" into Echo and Say, gRPC's "/pkg.Echo/Say" into pkg.Echo and
// Say; a name without a separator is all method. Label values must be
// UTF-8: invalid bytes become U+FFFD.
func splitMethod(full string) (service, method string) {
	full = strings.ToValidUTF8(full, "\uFFFD")
	if rest, ok := strings.CutPrefix(full, "/"); ok {
		if s, m, ok := strings.Cut(rest, "/"); ok {
			return s, m
		}
		return "", rest
	}
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "", full
}

// Invoke measures the call around next.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	side := info.Side
	if side != kernel.ClientSide && side != kernel.ServerSide {
		return next(ctx, info, req)
	}
	m := f.sides[side].get(info.Method)
	// In the call stage an attempt has no number before next; in the
	// attempt stage it has, and attempts are what is counted.
	attemptStage := info.Attempt > 0
	m.inFlight.Inc()
	// Two monotonic readings: time.Since costs one clock read, time.Now
	// two (the wall clock too), and the wall clock is no use here.
	start := time.Since(f.epoch)
	resp, err := next(ctx, info, req)
	m.duration.Observe((time.Since(f.epoch) - start).Seconds())
	m.inFlight.Dec()
	m.callsWith(codeOf(err)).Inc()
	if info.RequestSize > 0 {
		m.reqBytes.Add(float64(info.RequestSize))
	}
	if side == kernel.ClientSide {
		if info.ResponseSize > 0 {
			m.respBytes.Add(float64(info.ResponseSize))
		}
		if attemptStage {
			m.attempts.Inc()
		} else if info.Attempt > 0 {
			m.attempts.Add(float64(info.Attempt))
		}
	}
	return resp, err
}

// codeOf is kernel.CodeOf without its allocation for the errors calls
// usually end with: a *kernel.Status or a context error as such.
func codeOf(err error) kernel.Code {
	switch err {
	case nil:
		return kernel.OK
	case context.Canceled:
		return kernel.Canceled
	case context.DeadlineExceeded:
		return kernel.DeadlineExceeded
	}
	if s, ok := err.(*kernel.Status); ok {
		return s.Code
	}
	return kernel.CodeOf(err)
}
