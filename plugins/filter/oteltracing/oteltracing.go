// Package oteltracing is a filter that traces calls with OpenTelemetry: a
// server span per call, and on the client a span per call or per attempt,
// linked across the wire by W3C trace context (traceparent, tracestate) and
// baggage carried in the call's metadata.
//
// Config name: "otel-tracing". Options, with defaults:
//
//	filters:
//	  - name: otel-tracing
//	    options:
//	      span: call           # on the client: call (a span per call) or attempt (a span per attempt)
//	      exporter: none       # none | otlp-http | otlp-grpc | stdout
//	      endpoint: ""         # otlp: host:port or URL; "": the exporter's default or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT
//	      insecure: false      # otlp: plain HTTP or gRPC without TLS
//	      sampler: parent-ratio  # always | never | ratio | parent-ratio
//	      ratio: 1             # 0 to 1: the share of traces ratio and parent-ratio record
//	      service_name: ""     # the service.name resource attribute; "": OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES', else "kernrpc"
//
// # Config entries
//
// One entry with no side runs on both: a server span per call, and a
// client span per call. Attempt spans (one per pick, retry or hedge,
// beneath the call's span) take a second, client-only entry with span:
// attempt, which makes the filter run in the attempt stage without a
// stage of its own in the config:
//
//	filters:
//	  - name: otel-tracing                 # server spans, and the client's call spans
//	    options: {exporter: otlp-grpc, endpoint: "collector:4317", insecure: true}
//	  - name: otel-tracing                 # the client's attempt spans
//	    side: client
//	    options: {span: attempt}
//
// An attempt entry makes its spans with the tracer provider of the call span
// it runs beneath, and records them when that span records: it takes no
// exporter or sampler of its own, and without a recording call span above
// it, it records nothing. The traceparent a request carries is that of the
// innermost span the client made for it: the attempt's, when there is one.
//
// # Tracer provider
//
// With exporter none the filter uses otel's global TracerProvider
// (otel.GetTracerProvider), so an application that sets up OpenTelemetry
// itself, or a test that calls otel.SetTracerProvider, gets kernrpc's spans
// in its own pipeline; until the application sets one, nothing is recorded.
// The provider's own sampler then applies too: a span is recorded when both
// the filter's sampler and the provider's sample it. Code may instead pass
// a provider in Options.TracerProvider (New), and Options.StdoutWriter
// sends the stdout exporter's lines elsewhere. The other exporters make the
// filter build a TracerProvider of its own, with a batching span processor
// and a resource naming service_name, which Close flushes and shuts down;
// the engine closes filters when the Server or Client closes. The options
// of that provider (endpoint, insecure, service_name, StdoutWriter) are
// refused with exporter none, and those an exporter has no use for
// (endpoint and insecure for stdout) with it.
//
// # Sampling
//
// The filter decides before it starts a span, so that a call it does not
// record costs neither a span nor an allocation:
//
//   - always: record every call.
//   - never: record nothing; a trace context that comes in is passed on
//     unchanged, so that a trace crossing this service stays whole and the
//     services downstream decide by its sampled flag.
//   - ratio: record ratio of the traces, whatever the parent decided: a
//     trace that comes in is chosen by its trace ID (as the SDK's
//     TraceIDRatioBased), so that every service in mode ratio with the
//     same ratio agrees on it; one this call starts is chosen at random,
//     before its span (and its trace ID) exists. One declined still
//     sends an unsampled trace context: a service it calls in mode ratio
//     judges that trace by its ID, one in parent-ratio leaves it out.
//   - parent-ratio: follow the sampled flag of the caller's trace context;
//     a call that starts a trace is recorded with probability ratio, and
//     one that is not still sends an unsampled trace context, so that the
//     services it calls leave it out too.
//
// A call that is not recorded passes its parent's trace context on as it
// came: the request carries the parent's traceparent, tracestate and
// baggage, and on the server the handler's context carries them, so that
// the handler's own calls propagate them. The filter is a
// kernel.ContextValuer: the server's call context asks it for the
// caller's span only when the handler (or its calls) look, so passing an
// unsampled trace through costs the server's filter no allocation.
//
// # Attributes
//
// Spans follow OpenTelemetry's RPC semantic conventions as of semconv
// v1.43.0, the version this otel release's SDK uses (in which rpc.system.name
// and a fully qualified rpc.method replaced rpc.system, rpc.service and the
// short rpc.method): span name and rpc.method are the kernrpc method
// ("Echo.Say"), rpc.system.name is "kernrpc", rpc.response.status_code is the
// kernel status code's name ("OK", "Unavailable"). Client spans carry
// server.address and server.port (of the instance the last attempt went to),
// server spans network.peer.address and network.peer.port. kernrpc's own:
// rpc.kernrpc.attempt (the attempt's number on an attempt span, the number
// of attempts on a call span), rpc.kernrpc.request.size and
// rpc.kernrpc.response.size (encoded bytes; the server encodes its answer
// after its filters ran, so a server span ends when the engine says the
// answer is sent, kernel.CallObserver, and then has its size). A failed call records the error (RecordError, error.type
// set to the code's name) and sets the span's status to Error: on the client
// for every code but OK; on the server, as the conventions say for gRPC, only
// for codes that are the server's fault (Unknown, DeadlineExceeded,
// Unimplemented, Internal, Unavailable, DataLoss).
//
// # Streams
//
// The filter is a kernel.StreamFilter, with the same options and sampling:
// a streaming call is one span on each side for its whole life, named for
// its method, the client's (kind client) from the opening until the caller
// has read the end or closed the stream, the server's (kind server) around
// the handler, whose context carries it. The trace context (traceparent,
// tracestate, baggage) goes in the metadata of the request that opens the
// stream, as for a call, and an unrecorded stream passes its parent's on.
// The spans have the attributes a call's have (no sizes: a stream has
// none as a whole), and rpc.kernrpc.messages.sent and
// rpc.kernrpc.messages.received, the messages the side sent and received
// (SendMsg and RecvMsg returning nil), set when the stream ends; the end
// sets the status as for a call. A span: attempt entry makes no span for
// a stream, which the engine opens once beneath the filters: the call
// entry's span is the stream's.
package oteltracing

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "otel-tracing"

// instrumentationName names the tracer, as OpenTelemetry's contrib
// instrumentations are named after their package.
const instrumentationName = "github.com/kernrpc/kernrpc/plugins/filter/oteltracing"

// Options configure the filter.
type Options struct {
	// Span is, on the client, "call" (a span per call) or "attempt" (a span
	// per attempt, beneath the call's span; the filter then runs in the
	// attempt stage). The server makes a span per call either way.
	Span string `json:"span"`
	// Exporter is where the filter's own provider sends spans: "otlp-http",
	// "otlp-grpc" or "stdout"; "none" uses otel's global provider.
	Exporter string `json:"exporter"`
	// Endpoint is the OTLP collector's address; "" leaves it to the
	// exporter (its default, or the OTEL_EXPORTER_OTLP_* environment).
	Endpoint string `json:"endpoint"`
	// Insecure sends OTLP without TLS.
	Insecure bool `json:"insecure"`
	// Sampler is "always", "never", "ratio" or "parent-ratio".
	Sampler string `json:"sampler"`
	// Ratio is the share of traces ratio and parent-ratio record, 0 to 1.
	Ratio float64 `json:"ratio"`
	// ServiceName is the service.name resource attribute of the filter's
	// own provider; "" takes OTEL_SERVICE_NAME, else the service.name in
	// OTEL_RESOURCE_ATTRIBUTES, else "kernrpc".
	ServiceName string `json:"service_name"`
	// TracerProvider, if set, is used instead of otel's global provider
	// (exporter must then be none). Code only: config files cannot set it.
	TracerProvider trace.TracerProvider `json:"-"`
	// StdoutWriter is where the stdout exporter writes; nil: os.Stdout.
	// Code only.
	StdoutWriter io.Writer `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Span: "call", Exporter: "none", Sampler: "parent-ratio", Ratio: 1}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "OpenTelemetry spans per call and attempt, W3C trace context in metadata", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// sampler is the filter's sampling rule.
type sampler uint8

const (
	sampleAlways sampler = iota
	sampleNever
	sampleRatio
	sampleParentRatio
)

// Filter is the otel-tracing filter.
type Filter struct {
	attempt bool // on the client, spans per attempt
	tracer  trace.Tracer
	sampler sampler
	// bound is ratio scaled to the 63 bits a trace ID is compared on, as
	// the SDK's TraceIDRatioBased does.
	bound   uint64
	methods methodCache
	// own is the provider the filter built, nil with exporter none; Close
	// shuts it down once.
	own       *sdktrace.TracerProvider
	closeOnce sync.Once
	closeErr  error
	// open are the server spans whose answer is not sent yet, by call;
	// CallEnded ends them with the response size. nOpen counts them, so
	// that a server with none pays no lookup.
	open  sync.Map // *kernel.CallInfo -> trace.Span
	nOpen atomic.Int64
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.StagedFilter = (*Filter)(nil)
)

// New builds the filter from options, as a config's options block gives
// them or as code fills them in.
func New(o *Options) (kernel.Filter, error) {
	f := &Filter{}
	switch o.Span {
	case "call", "":
	case "attempt":
		f.attempt = true
		if o.Exporter != "none" && o.Exporter != "" {
			return nil, fmt.Errorf("option \"exporter\": is %q, but a span: attempt entry makes its spans with the provider of the call span above it; set the exporter on the call entry", o.Exporter)
		}
	default:
		return nil, fmt.Errorf("option \"span\": is %q; want call or attempt", o.Span)
	}
	var err error
	if f.sampler, err = parseSampler(o.Sampler); err != nil {
		return nil, fmt.Errorf("option \"sampler\": %w", err)
	}
	if !(o.Ratio >= 0 && o.Ratio <= 1) {
		return nil, fmt.Errorf("option \"ratio\": must be between 0 and 1, got %v", o.Ratio)
	}
	f.bound = uint64(o.Ratio * (1 << 63))
	if o.Ratio == 1 {
		f.bound = math.MaxUint64
	}
	tp := o.TracerProvider
	switch o.Exporter {
	case "none", "":
		if err := noProviderOptions(o); err != nil {
			return nil, err
		}
		if tp == nil {
			tp = otel.GetTracerProvider()
		}
	default:
		if tp != nil {
			return nil, fmt.Errorf("option \"exporter\": is %q, but Options.TracerProvider is set too; use one", o.Exporter)
		}
		if f.own, err = newProvider(o); err != nil {
			return nil, err
		}
		tp = f.own
	}
	f.tracer = tp.Tracer(instrumentationName)
	return f, nil
}

// noProviderOptions refuses, with exporter none, the options that
// configure a provider of the filter's own, which it then does not build:
// a config that names a collector but no exporter would otherwise send
// its spans nowhere it named.
func noProviderOptions(o *Options) error {
	const why = "but exporter is none: the spans go to the global (or given) tracer provider; set exporter to build one of the filter's own"
	switch {
	case o.Endpoint != "":
		return fmt.Errorf("option \"endpoint\": is %q, %s", o.Endpoint, why)
	case o.Insecure:
		return fmt.Errorf("option \"insecure\": is true, %s", why)
	case o.ServiceName != "":
		return fmt.Errorf("option \"service_name\": is %q, %s", o.ServiceName, why)
	case o.StdoutWriter != nil:
		return fmt.Errorf("Options.StdoutWriter is set, %s", why)
	}
	return nil
}

func parseSampler(s string) (sampler, error) {
	switch s {
	case "always":
		return sampleAlways, nil
	case "never":
		return sampleNever, nil
	case "ratio":
		return sampleRatio, nil
	case "parent-ratio", "":
		return sampleParentRatio, nil
	}
	return 0, fmt.Errorf("is %q; want always, never, ratio or parent-ratio", s)
}

// Stage puts a span: attempt entry in the attempt stage.
func (f *Filter) Stage() kernel.Stage {
	if f.attempt {
		return kernel.AttemptStage
	}
	return kernel.CallStage
}

// Invoke traces the call on the side it runs on.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side == kernel.ServerSide {
		return f.server(ctx, info, req, next)
	}
	if f.attempt {
		return f.clientAttempt(ctx, info, req, next)
	}
	return f.clientCall(ctx, info, req, next)
}

// Close flushes and shuts down the provider the filter built, if it built
// one; the global or a given provider is its owner's to shut down.
func (f *Filter) Close() error {
	f.closeOnce.Do(func() {
		if f.own != nil {
			ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			if err := f.own.Shutdown(ctx); err != nil {
				f.closeErr = fmt.Errorf("%s: shutting down the tracer provider: %w", Name, err)
			}
		}
	})
	return f.closeErr
}

// sampleRoot decides for a call that starts a trace.
func (f *Filter) sampleRoot() bool {
	switch f.sampler {
	case sampleAlways:
		return true
	case sampleNever:
		return false
	}
	return f.bound == math.MaxUint64 || randUint63() < f.bound
}

// sampleChild decides for a call whose parent is sc (valid).
func (f *Filter) sampleChild(sc trace.SpanContext) bool {
	switch f.sampler {
	case sampleAlways:
		return true
	case sampleNever:
		return false
	case sampleParentRatio:
		return sc.IsSampled()
	}
	return f.traceIDSampled(sc.TraceID())
}

// traceIDSampled is the SDK's TraceIDRatioBased decision.
func (f *Filter) traceIDSampled(id trace.TraceID) bool {
	if f.bound == math.MaxUint64 {
		return true
	}
	x := uint64(id[8])<<56 | uint64(id[9])<<48 | uint64(id[10])<<40 | uint64(id[11])<<32 |
		uint64(id[12])<<24 | uint64(id[13])<<16 | uint64(id[14])<<8 | uint64(id[15])
	return x>>1 < f.bound
}
