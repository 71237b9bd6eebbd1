package oteltracing_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
)

// With service_name empty and no OTEL_SERVICE_NAME, the service.name that
// OTEL_RESOURCE_ATTRIBUTES gives is the resource's, as OpenTelemetry's
// SDKs all read it ("OTEL_RESOURCE_ATTRIBUTES is read too"), not
// "kernrpc"; OTEL_SERVICE_NAME, and service_name, still come first.
func TestServiceNameFromResourceAttributes(t *testing.T) {
	for _, tc := range []struct {
		name, option, serviceEnv, want string
	}{
		{"OTEL_RESOURCE_ATTRIBUTES alone", "", "", "from-attributes"},
		{"OTEL_SERVICE_NAME first", "", "from-service-name", "from-service-name"},
		{"the option first", "from-option", "from-service-name", "from-option"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment.name=staging")
			t.Setenv("OTEL_SERVICE_NAME", tc.serviceEnv)
			var out strings.Builder
			o := oteltracing.DefaultOptions()
			o.Exporter, o.Sampler, o.ServiceName, o.StdoutWriter = "stdout", "always", tc.option, &out
			f, err := oteltracing.New(o)
			if err != nil {
				t.Fatal(err)
			}
			info := &kernel.CallInfo{Method: "Cart.Add", Side: kernel.ServerSide}
			if _, err := f.Invoke(context.Background(), info, nil, okNext); err != nil {
				t.Fatal(err)
			}
			closeFilter(t, f) // flushes the batch
			for _, want := range []string{
				`{"Key":"service.name","Value":{"Type":"STRING","Value":"` + tc.want + `"}}`,
				`{"Key":"deployment.environment.name","Value":{"Type":"STRING","Value":"staging"}}`,
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("stdout has no %s:\n%s", want, out.String())
				}
			}
		})
	}
}

// The options that configure the filter's own provider (endpoint,
// insecure, service_name) do nothing with exporter none, where the spans
// go to the global provider: a config that sets them but forgets the
// exporter must be refused, as an endpoint for stdout is, rather than
// send its spans nowhere it named.
func TestProviderOptionsWithoutTheirExporterAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options map[string]any
		key     string
	}{
		{"endpoint with exporter none", map[string]any{"endpoint": "collector:4317"}, "endpoint"},
		{"insecure with exporter none", map[string]any{"insecure": true}, "insecure"},
		{"service_name with exporter none", map[string]any{"service_name": "checkout"}, "service_name"},
		{"endpoint on an attempt entry", map[string]any{"span": "attempt", "endpoint": "collector:4317"}, "endpoint"},
		{"insecure for stdout", map[string]any{"exporter": "stdout", "insecure": true}, "insecure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := oteltracing.Factory.Build(tc.options, "svc.yaml")
			if err == nil {
				closeFilter(t, f)
				t.Fatalf("built with %v", tc.options)
			}
			if !strings.Contains(err.Error(), `option "`+tc.key+`"`) {
				t.Errorf("error %q does not name option %q", err, tc.key)
			}
		})
	}
	// Code that passes its own provider may still set nothing of these.
	o := oteltracing.DefaultOptions()
	o.StdoutWriter = io.Discard
	if f, err := oteltracing.New(o); err == nil {
		closeFilter(t, f)
		t.Error("StdoutWriter with exporter none: built")
	} else if !strings.Contains(err.Error(), "StdoutWriter") {
		t.Errorf("error %q does not name StdoutWriter", err)
	}
}
