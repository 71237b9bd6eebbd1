package oteltracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// clientCall makes a span for a client call, or passes the caller's trace
// context on if the sampler declines.
func (f *Filter) clientCall(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if f.clientDeclined(ctx, info) {
		return next(ctx, info, req)
	}
	ms := f.methods.get(info.Method)
	ctx, span := f.tracer.Start(ctx, ms.name, ms.client...)
	return f.clientSpan(ctx, span, info, req, next)
}

// clientDeclined decides whether the filter records a client call (or
// stream) of its own; when it does not, it has written into the request
// what goes on instead: the caller's trace context as it came, or an
// unsampled one for a trace the ratio declined to start.
func (f *Filter) clientDeclined(ctx context.Context, info *kernel.CallInfo) bool {
	// One lookup of the current span serves the decision and passOn.
	current := trace.SpanFromContext(ctx)
	if parent := current.SpanContext(); parent.IsValid() {
		if !f.sampleChild(parent) {
			passOn(ctx, current, info)
			return true
		}
	} else if !f.sampleRoot() {
		if f.sampler != sampleNever {
			// Declined for the ratio: tell the services called not to
			// start the trace either.
			injectSpanContext(info, unsampledRoot())
		}
		passBaggage(ctx, info)
		return true
	}
	return false
}

// clientAttempt makes a span for an attempt beneath the call's span, with
// that span's provider, if it records.
func (f *Filter) clientAttempt(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		passOn(ctx, parent, info)
		return next(ctx, info, req)
	}
	ms := f.methods.get(info.Method)
	ctx, span := parent.TracerProvider().Tracer(instrumentationName).Start(ctx, ms.attemptName, ms.clientAttempt...)
	return f.clientSpan(ctx, span, info, req, next)
}

// clientSpan sends the call under span and ends it.
func (f *Filter) clientSpan(ctx context.Context, span trace.Span, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	// The provider's own sampler may have declined (a global provider's):
	// its span context, unsampled, is still what goes on.
	propagator.Inject(ctx, requestCarrier{info})
	// A next that panics (a later filter's, a codec's) still ends the
	// span; the panic goes on to the caller.
	returned := false
	defer func() {
		if !returned {
			endClient(span, info, panicked(info))
		}
	}()
	resp, err := next(ctx, info, req)
	returned = true
	if span.IsRecording() {
		endClient(span, info, err)
	} else {
		span.End()
	}
	return resp, err
}

var _ propagation.TextMapCarrier = requestCarrier{}
