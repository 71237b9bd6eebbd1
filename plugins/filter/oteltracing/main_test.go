package oteltracing_test

import (
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

// spans receives every span the tests' filters record: they are built
// with exporter none, which uses otel's global provider, set here once to
// one that records every span it is handed and exports it synchronously
// (no goroutine) into memory. Tests that look at spans run one at a time
// and reset it first.
var spans = tracetest.NewInMemoryExporter()

func TestMain(m *testing.M) {
	// The engine's lines about servers starting and stopping say nothing
	// here.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithSampler(sdktrace.AlwaysSample())))
	// The servers, clients and exporters the tests start must all be gone.
	goleak.VerifyTestMain(m)
}
