package oteltracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// server makes a span for a call a server serves, or hands the caller's
// trace context to the handler if the sampler declines.
func (f *Filter) server(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	parent, raw, valid := extractRemote(info.Metadata)
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
			ctx = withRemote(ctx, parent, raw, rawTracestate(info.Metadata, parent))
		case f.sampler != sampleNever:
			// Declined for the ratio: the handler's calls say so.
			ctx = trace.ContextWithSpanContext(ctx, unsampledRoot())
		}
		return next(ctx, info, req)
	}
	if valid {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx = withBaggage(ctx, info.Metadata)
	ms := f.methods.get(info.Method)
	ctx, span := f.tracer.Start(ctx, ms.name, append(ms.server[:len(ms.server):len(ms.server)], trace.WithAttributes(serverAttributes(info)...))...)
	resp, err := next(ctx, info, req)
	if span.IsRecording() {
		endServer(span, err)
	} else {
		span.End()
	}
	return resp, err
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
