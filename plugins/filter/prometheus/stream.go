package prometheus

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/kernrpc/kernrpc/kernel"
)

var _ kernel.StreamFilter = (*Filter)(nil)

// The counters of a streaming method's shard, by index, laid out as a
// call method's are (metrics.go): a stream picks one shard when it opens,
// and its messages add to that shard for its whole life.
const (
	sStarted  = iota // streams that entered InvokeStream; in flight = started - ended
	sSent            // messages this side sent, SendMsg returning nil
	sReceived        // messages this side received, RecvMsg returning nil
	sCodes           // numCodes counters: streams ended, by code
	sCounters = sCodes + numCodes
)

// streamMetrics are one streaming method's figures on one side.
type streamMetrics struct {
	service, method string
	created         time.Time
	stride          int
	mask            uint32
	cells           []atomic.Uint64 // shards × stride, 128-byte aligned per shard
}

func newStreamMetrics(service, method string) *streamMetrics {
	m := &streamMetrics{service: service, method: method, created: time.Now(), stride: strideOf(sCounters), mask: shardMask()}
	m.cells = alignedCells(int(m.mask)+1, m.stride)
	return m
}

func (m *streamMetrics) shard() []atomic.Uint64 {
	i := int(rand.Uint32()&m.mask) * m.stride
	return m.cells[i : i+m.stride : i+m.stride]
}

// InvokeStream counts the stream when it opens and when it ends, by its
// code, and every message each way through a wrapper of st. A stream is
// not timed: it lasts as long as its application keeps it open, which
// says nothing of latency.
func (f *Filter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	side := info.Side
	if side != kernel.ClientSide && side != kernel.ServerSide {
		return next(ctx, info, st)
	}
	sh := f.calls.streams[side].get(info.Method).shard()
	sh[sStarted].Add(1)
	// A next that panics (a server's handler: the engine turns it into
	// Internal above the chain) still ends the stream here.
	returned := false
	defer func() {
		if !returned {
			sh[sCodes+int(kernel.Internal)].Add(1)
		}
	}()
	err := next(ctx, info, &meteredStream{Stream: st, shard: sh})
	returned = true
	sh[sCodes+codeIndex(codeOf(err))].Add(1)
	return err
}

// meteredStream counts the messages that pass into its stream's shard.
// One goroutine may send while another receives: the counters are atomic.
type meteredStream struct {
	kernel.Stream
	shard []atomic.Uint64
}

func (s *meteredStream) SendMsg(m any) error {
	err := s.Stream.SendMsg(m)
	if err == nil {
		s.shard[sSent].Add(1)
	}
	return err
}

func (s *meteredStream) RecvMsg(m any) error {
	err := s.Stream.RecvMsg(m)
	if err == nil {
		s.shard[sReceived].Add(1)
	}
	return err
}

// streamDescs are the stream families of one side, apart per side as the
// call families are.
type streamDescs struct {
	started, ended, inFlight, sent, received *prom.Desc
}

func newStreamDescs(side kernel.Side) streamDescs {
	name := func(n string) string { return prom.BuildFQName("kernrpc", side.String(), n) }
	sm := []string{labelService, labelMethod}
	opened := map[kernel.Side]string{kernel.ClientSide: "opened", kernel.ServerSide: "handled"}[side]
	return streamDescs{
		started:  prom.NewDesc(name("streams_started_total"), "Streaming calls "+opened+", by service and method.", sm, nil),
		ended:    prom.NewDesc(name("streams_ended_total"), "Streaming calls "+opened+" that ended, by service, method and status code.", []string{labelService, labelMethod, labelCode}, nil),
		inFlight: prom.NewDesc(name("streams_in_flight"), "Streaming calls "+opened+" that have not ended yet.", sm, nil),
		sent:     prom.NewDesc(name("stream_messages_sent_total"), "Messages this side sent on its streams, by service and method.", sm, nil),
		received: prom.NewDesc(name("stream_messages_received_total"), "Messages this side received on its streams, by service and method.", sm, nil),
	}
}

func (d *streamDescs) describe(ch chan<- *prom.Desc) {
	for _, desc := range []*prom.Desc{d.started, d.ended, d.inFlight, d.sent, d.received} {
		ch <- desc
	}
}

// streamTotals are one streaming method's counters added up over its
// shards.
type streamTotals struct {
	started, sent, received, ended uint64
	codes                          [numCodes]uint64
}

// add reads m's shards. Each shard's codes are read before its started
// count, and a stream adds to both in one shard, started first: so
// started is never below ended.
func (t *streamTotals) add(m *streamMetrics) {
	*t = streamTotals{}
	for off := 0; off < len(m.cells); off += m.stride {
		sh := m.cells[off : off+m.stride]
		for i := range numCodes {
			n := sh[sCodes+i].Load()
			t.codes[i] += n
			t.ended += n
		}
		t.started += sh[sStarted].Load()
		t.sent += sh[sSent].Load()
		t.received += sh[sReceived].Load()
	}
}

// collectStreams sends every streaming method's series of one side.
func (c *callCollector) collectStreams(ch chan<- prom.Metric, side kernel.Side) {
	d := &c.streamDescs[side]
	var t streamTotals
	for _, m := range c.streams[side].all() {
		t.add(m)
		svc, meth, ct := m.service, m.method, m.created
		ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.started, prom.CounterValue, float64(t.started), ct, svc, meth)
		for code, n := range t.codes {
			if n > 0 {
				ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.ended, prom.CounterValue, float64(n), ct, svc, meth, kernel.Code(code).String())
			}
		}
		ch <- prom.MustNewConstMetric(d.inFlight, prom.GaugeValue, float64(t.started-min(t.ended, t.started)), svc, meth)
		ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.sent, prom.CounterValue, float64(t.sent), ct, svc, meth)
		ch <- prom.MustNewConstMetricWithCreatedTimestamp(d.received, prom.CounterValue, float64(t.received), ct, svc, meth)
	}
}
