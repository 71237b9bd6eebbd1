package oteltracing

import (
	"context"
	"math/rand/v2"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kernrpc/kernrpc/kernel"
)

// The metadata keys of W3C trace context and baggage, lower-case as
// kernrpc's metadata keys are by convention.
const (
	traceparentKey = "traceparent"
	tracestateKey  = "tracestate"
	baggageKey     = "baggage"
)

// propagator writes and reads the trace context and baggage of recorded
// spans. It is the filter's own, not otel's global one, which is a no-op
// until an application sets it: the filter's job is W3C propagation.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// requestCarrier writes into a client call's request metadata, allocating
// the map on first use.
type requestCarrier struct{ info *kernel.CallInfo }

func (c requestCarrier) Get(k string) string { return c.info.Metadata[k] }
func (c requestCarrier) Set(k, v string)     { c.info.SetRequestMetadata(k, v) }
func (c requestCarrier) Keys() []string      { return metadataCarrier(c.info.Metadata).Keys() }

// metadataCarrier reads the metadata a server received; a nil map reads
// as empty.
type metadataCarrier kernel.Metadata

func (c metadataCarrier) Get(k string) string { return c[k] }

// Set writes nothing: a server's filter must not change the metadata the
// client sent, and extraction never calls it.
func (c metadataCarrier) Set(string, string) {}

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var (
	_ propagation.TextMapCarrier = requestCarrier{}
	_ propagation.TextMapCarrier = metadataCarrier(nil)
)

// parseTraceparent reads a version-00 traceparent without allocating; ok
// is false for anything else (an empty value included), which the caller
// leaves to the propagator, whose rules then apply.
func parseTraceparent(s string) (sc trace.SpanContext, ok bool) {
	if len(s) != 55 || s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return sc, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	if !decodeHex(tid[:], s[3:35]) || !decodeHex(sid[:], s[36:52]) {
		return sc, false
	}
	// Version 00 knows the sampled and (W3C Level 2) random flags; a
	// reserved bit set is left to the propagator, which refuses it.
	var flags [1]byte
	if !decodeHex(flags[:], s[53:55]) || trace.TraceFlags(flags[0])&^knownFlags != 0 {
		return sc, false
	}
	sc = trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true,
	})
	return sc, sc.IsValid()
}

// decodeHex decodes lower-case hex (W3C allows no other) into dst.
func decodeHex(dst []byte, s string) bool {
	bad := byte(0)
	for i := range dst {
		hi, lo := unhex[s[2*i]], unhex[s[2*i+1]]
		bad |= hi | lo
		dst[i] = hi<<4 | lo&15
	}
	return bad&0x10 == 0
}

// unhex maps a lower-case hex digit to its value and every other byte to
// 0x10, which decodeHex looks for once per field instead of once per digit.
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0x10
	}
	for i, c := range []byte("0123456789abcdef") {
		t[c] = byte(i)
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// knownFlags are the trace flags a version-00 traceparent carries, as
// otel's propagator reads and writes them.
const knownFlags = trace.FlagsSampled | trace.FlagsRandom

// formatTraceparent is sc as a version-00 traceparent.
func formatTraceparent(sc trace.SpanContext) string {
	var b [55]byte
	b[0], b[1], b[2] = '0', '0', '-'
	tid, sid := sc.TraceID(), sc.SpanID()
	for i, x := range tid {
		b[3+2*i], b[4+2*i] = hexDigits[x>>4], hexDigits[x&15]
	}
	b[35] = '-'
	for i, x := range sid {
		b[36+2*i], b[37+2*i] = hexDigits[x>>4], hexDigits[x&15]
	}
	b[52] = '-'
	fl := byte(sc.TraceFlags() & knownFlags)
	b[53], b[54] = hexDigits[fl>>4], hexDigits[fl&15]
	return string(b[:])
}

// unsampledRoot is a fresh trace context that says "not sampled": what a
// call the filter declines to start a trace for sends, so that the
// services it calls leave the trace out too.
func unsampledRoot() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() || !sid.IsValid() {
		a, b, c := rand.Uint64(), rand.Uint64(), rand.Uint64()
		for i := range 8 {
			tid[i], tid[8+i], sid[i] = byte(a>>(8*i)), byte(b>>(8*i)), byte(c>>(8*i))
		}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
}

func randUint63() uint64 { return rand.Uint64() >> 1 }

// remoteSpan is the caller's span as a server that records no span of its
// own hands it to its handler: otel sees a non-recording span with the
// caller's span context, and the filter, on the handler's own calls, sends
// the traceparent and tracestate the caller sent as they came, instead of
// formatting them again.
type remoteSpan struct {
	embedded.Span
	sc                      trace.SpanContext
	traceparent, tracestate string
}

func (s *remoteSpan) SpanContext() trace.SpanContext          { return s.sc }
func (s *remoteSpan) IsRecording() bool                       { return false }
func (s *remoteSpan) End(...trace.SpanEndOption)              {}
func (s *remoteSpan) AddEvent(string, ...trace.EventOption)   {}
func (s *remoteSpan) AddLink(trace.Link)                      {}
func (s *remoteSpan) RecordError(error, ...trace.EventOption) {}
func (s *remoteSpan) SetStatus(codes.Code, string)            {}
func (s *remoteSpan) SetName(string)                          {}
func (s *remoteSpan) SetAttributes(...attribute.KeyValue)     {}
func (s *remoteSpan) TracerProvider() trace.TracerProvider    { return noop.NewTracerProvider() }

var _ trace.Span = (*remoteSpan)(nil)

// remoteCtx is a context carrying a remoteSpan as otel's current span: one
// allocation, where trace.ContextWithRemoteSpanContext takes two (the span
// boxed in an interface, and the context).
type remoteCtx struct {
	context.Context
	span remoteSpan
}

func (c *remoteCtx) Value(key any) any {
	if key == spanKey {
		return trace.Span(&c.span)
	}
	return c.Context.Value(key)
}

// spanKey is the key otel's trace package keeps the current span under,
// learnt by asking trace.SpanFromContext for it: the key is unexported.
// remoteCtxWorks checks, once, that a remoteCtx is read back as otel's
// current span; if a later otel looked spans up otherwise, withRemote
// falls back to otel's own (allocating) way.
var (
	spanKey        = probeSpanKey()
	remoteCtxWorks = checkRemoteCtx()
)

type keyProbe struct {
	context.Context
	asked *any
}

func (p keyProbe) Value(key any) any {
	if *p.asked == nil {
		*p.asked = key
	}
	return nil
}

func probeSpanKey() any {
	var asked any
	trace.SpanFromContext(keyProbe{context.Background(), &asked})
	return asked
}

func checkRemoteCtx() bool {
	if spanKey == nil {
		return false
	}
	sc := unsampledRoot().WithRemote(true)
	ctx := &remoteCtx{Context: context.Background(), span: remoteSpan{sc: sc}}
	return trace.SpanContextFromContext(ctx).Equal(sc) && trace.SpanFromContext(ctx) == trace.Span(&ctx.span)
}

// withRemote returns ctx with sc, the caller's span context as received in
// traceparent (and tracestate), as the current span.
func withRemote(ctx context.Context, sc trace.SpanContext, traceparent, tracestate string) context.Context {
	if !remoteCtxWorks {
		return trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return &remoteCtx{Context: ctx, span: remoteSpan{sc: sc, traceparent: traceparent, tracestate: tracestate}}
}

// passOn writes into a client request the trace context of span, the one
// ctx carries (which the filter did not make), and ctx's baggage: the context
// goes on unchanged past a call the filter does not record. A request that
// already carries a traceparent (the call entry's, in an attempt entry)
// keeps it.
func passOn(ctx context.Context, span trace.Span, info *kernel.CallInfo) {
	if _, ok := info.Metadata[traceparentKey]; ok {
		return
	}
	if rs, ok := span.(*remoteSpan); ok && rs.traceparent != "" {
		info.SetRequestMetadata(traceparentKey, rs.traceparent)
		if rs.tracestate != "" {
			info.SetRequestMetadata(tracestateKey, rs.tracestate)
		}
	} else if sc := span.SpanContext(); sc.IsValid() {
		injectSpanContext(info, sc)
	}
	passBaggage(ctx, info)
}

// passBaggage writes the baggage ctx carries into a client request.
func passBaggage(ctx context.Context, info *kernel.CallInfo) {
	if bag := baggage.FromContext(ctx); bag.Len() > 0 {
		info.SetRequestMetadata(baggageKey, bag.String())
	}
}

// injectSpanContext writes sc into a client request.
func injectSpanContext(info *kernel.CallInfo, sc trace.SpanContext) {
	info.SetRequestMetadata(traceparentKey, formatTraceparent(sc))
	if ts := sc.TraceState(); ts.Len() > 0 {
		info.SetRequestMetadata(tracestateKey, ts.String())
	}
}

// extractRemote reads the caller's trace context from a server's request
// metadata: from a version-00 traceparent without allocating (but for its
// tracestate, when there is one), else through the propagator. valid is
// false when the request carries none that can be used; raw is the
// traceparent as sent when it can be passed on as it is (version 00,
// canonical), else "".
func extractRemote(md kernel.Metadata) (sc trace.SpanContext, raw string, valid bool) {
	sc, raw, valid = remoteParent(md)
	if raw != "" {
		sc = withTracestate(sc, md)
	}
	return sc, raw, valid
}

// remoteParent is extractRemote but for the tracestate of a version-00
// traceparent, which a call that records nothing and passes its parent on
// through its server's context (CallValue) does not need.
func remoteParent(md kernel.Metadata) (sc trace.SpanContext, raw string, valid bool) {
	tp := md[traceparentKey]
	if tp == "" {
		return sc, "", false
	}
	sc, ok := parseTraceparent(tp)
	if !ok {
		sc = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), metadataCarrier(md)))
		return sc, "", sc.IsValid()
	}
	return sc, tp, true
}

// withTracestate adds the tracestate md carries to sc, if it parses.
func withTracestate(sc trace.SpanContext, md kernel.Metadata) trace.SpanContext {
	if ts := md[tracestateKey]; ts != "" {
		if state, err := trace.ParseTraceState(ts); err == nil {
			return sc.WithTraceState(state)
		}
	}
	return sc
}

// withBaggage adds the baggage a server's request carries to ctx.
func withBaggage(ctx context.Context, md kernel.Metadata) context.Context {
	if md[baggageKey] == "" {
		return ctx
	}
	return propagation.Baggage{}.Extract(ctx, metadataCarrier(md))
}
