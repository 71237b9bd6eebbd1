package oteltracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// The filter reads a version-00 traceparent itself, and leaves anything
// else to otel's TraceContext propagator, "whose rules then apply": the
// two must agree on every traceparent, or whether a trace crosses a
// service (and with which flags) would depend on the path taken.
func TestExtractRemoteAgreesWithThePropagator(t *testing.T) {
	base := strings.TrimSuffix(validTP, "01")
	for _, tp := range []string{
		validTP,
		base + "00",
		base + "02", // W3C Level 2: random trace ID, not sampled
		base + "03", // random and sampled
		base + "04", // a reserved bit, which version 00 does not allow
		base + "09",
		base + "ff",
		strings.ToUpper(validTP),
		"01" + validTP[2:],
		"01" + validTP[2:] + "-what-comes-next",
		"ff" + validTP[2:],
		validTP + "-extra",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"",
	} {
		md := kernel.Metadata{traceparentKey: tp, tracestateKey: "vendor=abc"}
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), metadataCarrier(md)))
		got, _, valid := extractRemote(md)
		if valid != want.IsValid() || valid && !got.Equal(want) {
			t.Errorf("traceparent %q: the filter reads %v (valid %v, flags %s), otel's propagator %v (valid %v, flags %s)",
				tp, got, valid, got.TraceFlags(), want, want.IsValid(), want.TraceFlags())
		}
	}
}

// A span context passed on (a call the filter does not record) keeps the
// flags otel's propagator would write: the random flag included.
func TestFormatTraceparentKeepsTheFlagsOtelWrites(t *testing.T) {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{traceparentKey: strings.TrimSuffix(validTP, "01") + "03"}))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	if got, want := formatTraceparent(sc), carrier[traceparentKey]; got != want {
		t.Errorf("formatTraceparent = %q, otel's propagator writes %q", got, want)
	}
}
