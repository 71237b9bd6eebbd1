package oteltracing

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

var _ kernel.StreamFilter = (*Filter)(nil)

// The counts of a stream's messages, set on its span when it ends.
const (
	messagesSentKey     = attribute.Key("rpc.kernrpc.messages.sent")
	messagesReceivedKey = attribute.Key("rpc.kernrpc.messages.received")
)

// InvokeStream traces a streaming call with one span for its whole life,
// as Invoke does a call: the client's span (kind client) from the opening,
// whose request carries its trace context, until the caller is done with
// the stream; the server's (kind server) around the handler. The span
// counts the messages each side sent and received. A span: attempt entry
// makes no span of its own for a stream (the engine opens it once, past
// the filters) and passes the trace context on.
func (f *Filter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	switch {
	case info.Side == kernel.ServerSide:
		return f.serverStream(ctx, info, st, next)
	case f.attempt:
		passOn(ctx, trace.SpanFromContext(ctx), info)
		return next(ctx, info, st)
	}
	return f.clientStream(ctx, info, st, next)
}

// clientStream makes a span for a client's stream, or passes the caller's
// trace context on if the sampler declines.
func (f *Filter) clientStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if f.clientDeclined(ctx, info) {
		return next(ctx, info, st)
	}
	ms := f.methods.get(info.Method)
	ctx, span := f.tracer.Start(ctx, ms.name, ms.client...)
	// The provider's own sampler may have declined (a global provider's):
	// its span context, unsampled, is still what goes on.
	propagator.Inject(ctx, requestCarrier{info})
	returned := false
	defer func() {
		if !returned {
			endClient(span, info, panicked(info))
		}
	}()
	recorded, err := runStream(ctx, span, info, st, next)
	returned = true
	if recorded {
		endClient(span, info, err)
	}
	return err
}

// runStream passes the stream on under span: counting its messages into
// span's attributes when span records (and leaving the span to the caller
// to end), else ending span at once.
func runStream(ctx context.Context, span trace.Span, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) (recorded bool, err error) {
	if !span.IsRecording() {
		err = next(ctx, info, st)
		span.End()
		return false, err
	}
	counted := &countedStream{Stream: st}
	err = next(ctx, info, counted)
	span.SetAttributes(counted.attributes()...)
	return true, err
}

// serverStream makes a span for a stream the server handles, or hands the
// caller's trace context to the handler if the sampler declines.
func (f *Filter) serverStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	ctx, record := f.serverContext(ctx, info)
	if !record {
		return next(ctx, info, st)
	}
	ms := f.methods.get(info.Method)
	ctx, span := f.tracer.Start(ctx, ms.name, append(ms.server[:len(ms.server):len(ms.server)], trace.WithAttributes(serverAttributes(info)...))...)
	// The engine sends the stream's final status once the handler has
	// returned; there is no answer's size to wait for. A handler that
	// panics (answered Internal by the engine) still ends the span.
	returned := false
	defer func() {
		if !returned {
			endServer(span, panicked(info))
		}
	}()
	recorded, err := runStream(ctx, span, info, st, next)
	returned = true
	if recorded {
		endServer(span, err)
	}
	return err
}

// countedStream counts the messages that pass. One goroutine may send
// while another receives, so the counts are atomic.
type countedStream struct {
	kernel.Stream
	sent, received atomic.Int64
}

func (s *countedStream) SendMsg(m any) error {
	err := s.Stream.SendMsg(m)
	if err == nil {
		s.sent.Add(1)
	}
	return err
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.Stream.RecvMsg(m)
	if err == nil {
		s.received.Add(1)
	}
	return err
}

func (s *countedStream) attributes() []attribute.KeyValue {
	return []attribute.KeyValue{messagesSentKey.Int64(s.sent.Load()), messagesReceivedKey.Int64(s.received.Load())}
}
