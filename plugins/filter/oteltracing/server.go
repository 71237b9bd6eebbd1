package oteltracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// server makes a span for a call a server serves, or hands the caller's
// trace context to the handler if the sampler declines.
func (f *Filter) server(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	ctx, record := f.serverContext(ctx, info)
	if !record {
		return next(ctx, info, req)
	}
	ms := f.methods.get(info.Method)
	ctx, span := f.tracer.Start(ctx, ms.name, append(ms.server[:len(ms.server):len(ms.server)], trace.WithAttributes(serverAttributes(info)...))...)
	// A next that panics (the engine turns a handler's panic into
	// Internal above the chain) still ends the span, or it would never be
	// exported. An open-coded defer: about a ns.
	returned := false
	defer func() {
		if !returned {
			endServer(span, panicked(info))
		}
	}()
	resp, err := next(ctx, info, req)
	returned = true
	switch {
	case !span.IsRecording():
		span.End()
	default:
		// Under a server, which calls CallEnded once the answer is
		// encoded and sent, the span ends there, with the response size.
		// It is kept under the server's CallInfo, which CallEnded is
		// given: a filter ahead of this one may have passed a copy on.
		if served := f.servedInfo(ctx); served != nil {
			f.nOpen.Add(1)
			f.open.Store(served, span)
		} else {
			endServer(span, err)
		}
	}
	return resp, err
}

// servedInfo is the CallInfo of the call ctx belongs to, as the server
// holds it, when ctx is a server's call context that asks this filter's
// CallValue; else nil.
func (f *Filter) servedInfo(ctx context.Context) *kernel.CallInfo {
	served, _ := ctx.Value(valuerProbe{f}).(*kernel.CallInfo)
	return served
}

// serverContext decides whether the filter records a server call (or
// stream) of its own, and returns the context next gets: with the
// caller's trace context as its parent when it records, else carrying
// that context on for the handler's own calls (or an unsampled one for a
// trace the ratio declined to start).
func (f *Filter) serverContext(ctx context.Context, info *kernel.CallInfo) (context.Context, bool) {
	// The tracestate is read only where it is needed: not for the
	// decision, nor for a parent the handler's context gets from CallValue.
	parent, raw, valid := remoteParent(info.Metadata)
	var record bool
	if valid {
		record = f.sampleChild(parent)
	} else {
		record = f.sampleRoot()
	}
	if !record {
		ctx = withBaggage(ctx, info.Metadata)
		switch {
		case valid:
			if !remoteCtxWorks || f.servedInfo(ctx) == nil {
				// Not under a server that asks CallValue (a stream's
				// context, or a test calling Invoke), or otel's span key
				// is unknown: the context must carry the parent itself.
				if raw != "" {
					parent = withTracestate(parent, info.Metadata)
				}
				ctx = withRemote(ctx, parent, raw, rawTracestate(info.Metadata, parent))
			}
		case f.sampler != sampleNever:
			// Declined for the ratio: the handler's calls say so.
			ctx = trace.ContextWithSpanContext(ctx, unsampledRoot())
		}
		return ctx, false
	}
	if valid {
		// Now with its tracestate, which the decision did not need.
		parent, _, _ = extractRemote(info.Metadata)
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	return withBaggage(ctx, info.Metadata), true
}

// CallEnded ends the span of a call the filter recorded, once its answer
// is sent, with its size: the server encodes the answer after the filters
// return, so only now is the size known.
func (f *Filter) CallEnded(info *kernel.CallInfo, err error, handled bool) {
	if !handled || f.nOpen.Load() == 0 {
		return
	}
	v, ok := f.open.LoadAndDelete(info)
	if !ok {
		return
	}
	f.nOpen.Add(-1)
	span := v.(trace.Span)
	if info.ResponseSize > 0 {
		span.SetAttributes(responseSizeKey.Int(info.ResponseSize))
	}
	endServer(span, err)
}

// rawTracestate is the tracestate the caller sent, if it is the one parent
// holds (it parsed); passing on what did not parse would send on what otel
// drops.
func rawTracestate(md kernel.Metadata, parent trace.SpanContext) string {
	if parent.TraceState().Len() == 0 {
		return ""
	}
	return md[tracestateKey]
}

// valuerProbe is the key a server filter asks its context for to learn
// whether the handler's context asks its CallValue (the server's does),
// and the CallInfo the server holds for the call, which the filter's may
// be a copy of.
type valuerProbe struct{ f *Filter }

// CallValue gives the handler's context of a call the filter does not
// record the caller's trace context, read from the call's metadata only
// when someone asks for it (the handler's own calls do), so that passing
// an unsampled trace on costs the server's filter no allocation. A call
// the filter records has its span in a context nearer the handler, which
// is found first.
func (f *Filter) CallValue(info *kernel.CallInfo, key any) (any, bool) {
	if p, ok := key.(valuerProbe); ok && p.f == f {
		return info, true
	}
	switch key {
	case spanKey:
		parent, raw, valid := extractRemote(info.Metadata)
		if !valid {
			return nil, false
		}
		return trace.Span(&remoteSpan{sc: parent, traceparent: raw, tracestate: rawTracestate(info.Metadata, parent)}), true
	}
	return nil, false
}

var (
	_ kernel.ContextValuer = (*Filter)(nil)
	_ kernel.CallObserver  = (*Filter)(nil)
)
