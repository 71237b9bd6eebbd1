package prometheus

import (
	"errors"
	"fmt"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/kernrpc/kernrpc/kernel"
)

// The label names, in the order the families take their values.
const (
	labelService = "service"
	labelMethod  = "method"
	labelCode    = "code"
)

// sideDescs are the call families of one side. The families are separate
// per side (kernrpc_client_*, kernrpc_server_*), not a side label,
// because a call measured at both ends would otherwise be summed twice by
// sum(), and because the sides know different things (only the client
// sees the attempts).
type sideDescs struct {
	calls     *prom.Desc // service, method, code
	duration  *prom.Desc // service, method
	inFlight  *prom.Desc // service, method
	reqBytes  *prom.Desc // service, method
	respBytes *prom.Desc // service, method
	attempts  *prom.Desc // service, method; client only
}

// callCollector is the call families of a registry: the counters the
// calls add to (metrics.go), added up over their shards at each scrape
// into const metrics. With registry: default the filters of a process
// share the first one's collector, its buckets and max_methods, so that
// the calls of two Clients of one service add up in one series.
type callCollector struct {
	sides  [3]methodTable[methodMetrics] // indexed by kernel.Side
	shapes [3]*shape
	descs  [3]sideDescs
	// The stream families, apart: a streaming method has no latency and
	// no request, and its series appear with its first stream.
	streams     [3]methodTable[streamMetrics]
	streamDescs [3]streamDescs
}

var _ prom.Collector = (*callCollector)(nil)

func newCallCollector(buckets []float64, native bool, maxMethods int) *callCollector {
	c := &callCollector{}
	for _, side := range []kernel.Side{kernel.ClientSide, kernel.ServerSide} {
		c.descs[side] = newSideDescs(side)
		var vec *prom.HistogramVec
		if native {
			vec = nativeHistogram(side, buckets)
		}
		sh := newShape(buckets, vec)
		c.shapes[side] = sh
		c.sides[side].init(func(service, method string) *methodMetrics { return newMethodMetrics(sh, service, method) }, maxMethods)
		c.streamDescs[side] = newStreamDescs(side)
		c.streams[side].init(newStreamMetrics, maxMethods)
	}
	return c
}

func newSideDescs(side kernel.Side) sideDescs {
	name := func(n string) string { return prom.BuildFQName("kernrpc", side.String(), n) }
	sm := []string{labelService, labelMethod}
	who := map[kernel.Side]string{kernel.ClientSide: "made", kernel.ServerSide: "handled"}[side]
	d := sideDescs{
		calls:    prom.NewDesc(name("calls_total"), "Calls "+who+", by service, method and status code.", []string{labelService, labelMethod, labelCode}, nil),
		duration: prom.NewDesc(name("call_duration_seconds"), durationHelp, sm, nil),
		inFlight: prom.NewDesc(name("calls_in_flight"), "Calls "+map[kernel.Side]string{kernel.ClientSide: "made", kernel.ServerSide: "being handled"}[side]+" that have not ended yet.", sm, nil),
		reqBytes: prom.NewDesc(name("request_bytes_total"), "Encoded size of the requests of the calls "+who+", in bytes.", sm, nil),
	}
	if side == kernel.ClientSide {
		d.respBytes = prom.NewDesc(name("response_bytes_total"), "Encoded size of the responses received, in bytes.", sm, nil)
		d.attempts = prom.NewDesc(name("attempts_total"), "Attempts the calls made took, retries and hedges included.", sm, nil)
	} else {
		d.respBytes = prom.NewDesc(name("response_bytes_total"), "Encoded size of the responses sent, in bytes.", sm, nil)
	}
	return d
}

const durationHelp = "Time from the start of a call to its outcome, as this side measures it, in seconds."

// nativeHistogram is the library's histogram, kept beside the shards with
// native_histograms: a const native histogram would need the sparse
// buckets kept by hand, so these calls pay the library's shared atomics.
// It is not registered: the collector collects it under the same desc.
func nativeHistogram(side kernel.Side, buckets []float64) *prom.HistogramVec {
	return prom.NewHistogramVec(prom.HistogramOpts{
		Namespace: "kernrpc", Subsystem: side.String(), Name: "call_duration_seconds",
		Help:    durationHelp,
		Buckets: buckets,
		// About 10% wide buckets; bounded in number, and reset at most
		// hourly when the bound is hit, as client_golang advises.
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}, []string{labelService, labelMethod})
}

// registerCalls registers a collector of the call families in reg, or
// returns the one another filter registered there.
func registerCalls(reg prom.Registerer, buckets []float64, native bool, maxMethods int) (*callCollector, error) {
	c := newCallCollector(buckets, native, maxMethods)
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prom.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*callCollector); ok {
			return existing, nil
		}
	}
	return nil, fmt.Errorf("registering the call metrics: %w", err)
}

func (c *callCollector) Describe(ch chan<- *prom.Desc) {
	for _, side := range []kernel.Side{kernel.ClientSide, kernel.ServerSide} {
		d := &c.descs[side]
		for _, desc := range []*prom.Desc{d.calls, d.duration, d.inFlight, d.reqBytes, d.respBytes, d.attempts} {
			if desc != nil {
				ch <- desc
			}
		}
		c.streamDescs[side].describe(ch)
	}
}

// totals are one method's counters added up over its shards.
type totals struct {
	started, reqBytes, respBytes, attempts, sumNanos uint64
	codes                                            [numCodes]uint64
	buckets                                          []uint64 // not cumulative
	ended                                            uint64   // the buckets' sum
}

// add reads m's shards into t. Each shard's buckets are read before its
// started count, and a call adds to both in one shard, started first:
// so started is never below ended, and in flight never negative.
func (t *totals) add(m *methodMetrics) {
	s := m.shape
	nb := len(s.bounds) + 1
	b := t.buckets
	if cap(b) < nb {
		b = make([]uint64, nb)
	}
	b = b[:nb]
	clear(b)
	*t = totals{buckets: b}
	for off := 0; off < len(m.cells); off += s.stride {
		sh := m.cells[off : off+s.stride]
		for i := range nb {
			n := sh[cBuckets+i].Load()
			t.buckets[i] += n
			t.ended += n
		}
		t.started += sh[cStarted].Load()
		t.sumNanos += sh[cSumNanos].Load()
		t.reqBytes += sh[cReqBytes].Load()
		t.respBytes += sh[cRespBytes].Load()
		t.attempts += sh[cAttempts].Load()
		for i := range numCodes {
			t.codes[i] += sh[cCodes+i].Load()
		}
	}
}

// Collect sends every method's series: one calls series per code it
// ended with, and the others from its first call on.
func (c *callCollector) Collect(ch chan<- prom.Metric) {
	var t totals
	for _, side := range []kernel.Side{kernel.ClientSide, kernel.ServerSide} {
		d := &c.descs[side]
		tab := &c.sides[side]
		for _, m := range tab.all() {
			t.add(m)
			svc, meth, ct := m.service, m.method, m.created
			for code, n := range t.codes {
				if n > 0 {
					ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.calls, prom.CounterValue, float64(n), ct, svc, meth, kernel.Code(code).String())
				}
			}
			if m.native == nil {
				cum := make(map[float64]uint64, len(t.buckets)-1)
				var sum uint64
				for i, bound := range c.shapes[side].secs {
					sum += t.buckets[i]
					cum[bound] = sum
				}
				ch <- prom.MustNewConstHistogramWithCreatedTimestamp(d.duration, t.ended, float64(t.sumNanos)/1e9, cum, ct, svc, meth)
			}
			ch <- prom.MustNewConstMetric(d.inFlight, prom.GaugeValue, float64(t.started-min(t.ended, t.started)), svc, meth)
			ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.reqBytes, prom.CounterValue, float64(t.reqBytes), ct, svc, meth)
			ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.respBytes, prom.CounterValue, float64(t.respBytes), ct, svc, meth)
			if d.attempts != nil {
				ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.attempts, prom.CounterValue, float64(t.attempts), ct, svc, meth)
			}
		}
		if native := c.shapes[side].native; native != nil {
			native.Collect(ch)
		}
		c.collectStreams(ch, side)
	}
}
