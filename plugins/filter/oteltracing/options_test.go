package oteltracing_test

import (
	"context"
	"io"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
)

func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options map[string]any
		key     string // the option the error must name
		says    string
	}{
		{"unknown span", map[string]any{"span": "hedge"}, "span", "want call or attempt"},
		{"unknown sampler", map[string]any{"sampler": "sometimes"}, "sampler", "want always, never, ratio or parent-ratio"},
		{"ratio over 1", map[string]any{"ratio": 1.5}, "ratio", "between 0 and 1"},
		{"negative ratio", map[string]any{"ratio": -0.1}, "ratio", "between 0 and 1"},
		{"unknown exporter", map[string]any{"exporter": "jaeger"}, "exporter", "want none, otlp-http, otlp-grpc or stdout"},
		{"exporter on an attempt entry", map[string]any{"span": "attempt", "exporter": "stdout"}, "exporter", "provider of the call span"},
		{"endpoint neither host:port nor URL", map[string]any{"exporter": "otlp-grpc", "endpoint": "collector"}, "endpoint", "neither host:port nor a URL"},
		{"endpoint URL of another scheme", map[string]any{"exporter": "otlp-http", "endpoint": "ftp://collector:4318"}, "endpoint", "not an http or https URL"},
		{"endpoint URL that does not parse", map[string]any{"exporter": "otlp-http", "endpoint": "http://[::1"}, "endpoint", "option \"endpoint\""},
		{"endpoint for stdout", map[string]any{"exporter": "stdout", "endpoint": "127.0.0.1:4317"}, "endpoint", "standard output"},
		{"ratio of the wrong type", map[string]any{"ratio": "half"}, "ratio", ""},
		{"an option that does not exist", map[string]any{"sample_rate": 0.5}, "sample_rate", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := oteltracing.Factory.Build(tc.options, "svc.yaml")
			if err == nil {
				closeFilter(t, f)
				t.Fatalf("built with %v", tc.options)
			}
			if !strings.Contains(err.Error(), `option "`+tc.key+`"`) && !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q does not name option %q", err, tc.key)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func TestTracerProviderAndExporterExclude(t *testing.T) {
	o := oteltracing.DefaultOptions()
	o.Exporter = "stdout"
	o.TracerProvider = sdktrace.NewTracerProvider()
	if f, err := oteltracing.New(o); err == nil || !strings.Contains(err.Error(), `option "exporter"`) {
		if f != nil {
			closeFilter(t, f)
		}
		t.Fatalf("exporter and TracerProvider together: %v", err)
	}
}

func closeFilter(t *testing.T, f kernel.Filter) {
	t.Helper()
	if c, ok := f.(io.Closer); ok {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// Each exporter builds a provider of its own, which Close shuts down
// (goleak in TestMain sees any goroutine left); Close twice is fine.
func TestOwnProviderExportersBuildAndClose(t *testing.T) {
	for _, options := range []map[string]any{
		{"exporter": "otlp-http"},
		{"exporter": "otlp-http", "endpoint": "127.0.0.1:1", "insecure": true},
		{"exporter": "otlp-http", "endpoint": "http://127.0.0.1:1/v1/traces"},
		{"exporter": "otlp-grpc", "endpoint": "127.0.0.1:1", "insecure": true},
		{"exporter": "otlp-grpc", "endpoint": "http://127.0.0.1:1"},
		{"exporter": "otlp-grpc", "service_name": "checkout"},
	} {
		f, err := oteltracing.Factory.Build(options, "svc.yaml")
		if err != nil {
			t.Fatalf("%v: %v", options, err)
		}
		c := f.(io.Closer)
		// Nothing was recorded, so nothing is sent to the absent
		// collector: Close returns at once, with no error.
		if err := c.Close(); err != nil {
			t.Errorf("%v: Close: %v", options, err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("%v: second Close: %v", options, err)
		}
	}
}

// The stdout exporter writes each recorded span, with the resource's
// service.name, when the filter closes.
func TestStdoutExporterWritesSpansWithServiceName(t *testing.T) {
	var out strings.Builder
	o := oteltracing.DefaultOptions()
	o.Exporter, o.Sampler, o.ServiceName, o.StdoutWriter = "stdout", "always", "checkout", &out
	f, err := oteltracing.New(o)
	if err != nil {
		t.Fatal(err)
	}
	info := &kernel.CallInfo{Method: "Cart.Add", Side: kernel.ServerSide, Peer: "127.0.0.1:5000"}
	if _, err := f.Invoke(context.Background(), info, nil, okNext); err != nil {
		t.Fatal(err)
	}
	closeFilter(t, f) // flushes the batch
	for _, want := range []string{`"Name":"Cart.Add"`, `"Value":"checkout"`, `"Key":"rpc.system.name"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout has no %s:\n%s", want, out.String())
		}
	}
}
