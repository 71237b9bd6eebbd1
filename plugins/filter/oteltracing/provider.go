package oteltracing

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// shutdownTimeout bounds Close: the batcher's last export to a collector
// that does not answer must not hold up a server's shutdown for long.
const shutdownTimeout = 5 * time.Second

// newProvider builds the filter's own TracerProvider for o.Exporter. It
// samples every span it is asked for: the filter has decided before it
// starts one.
func newProvider(o *Options) (*sdktrace.TracerProvider, error) {
	exp, err := newExporter(o)
	if err != nil {
		return nil, err
	}
	res, err := newResource(o.ServiceName)
	if err != nil {
		_ = exp.Shutdown(context.Background())
		return nil, fmt.Errorf("option \"service_name\": %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
	), nil
}

func newExporter(o *Options) (sdktrace.SpanExporter, error) {
	ctx := context.Background() // neither OTLP exporter connects in New
	if o.StdoutWriter != nil && (o.Exporter == "otlp-http" || o.Exporter == "otlp-grpc") {
		return nil, fmt.Errorf("Options.StdoutWriter is set, but exporter is %q, not stdout", o.Exporter)
	}
	switch o.Exporter {
	case "otlp-http":
		var opts []otlptracehttp.Option
		if o.Endpoint != "" {
			isURL, err := endpointKind(o.Endpoint)
			if err != nil {
				return nil, err
			}
			if isURL {
				opts = append(opts, otlptracehttp.WithEndpointURL(o.Endpoint))
			} else {
				opts = append(opts, otlptracehttp.WithEndpoint(o.Endpoint))
			}
		}
		if o.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("option \"exporter\": otlp-http: %w", err)
		}
		return exp, nil
	case "otlp-grpc":
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			isURL, err := endpointKind(o.Endpoint)
			if err != nil {
				return nil, err
			}
			if isURL {
				opts = append(opts, otlptracegrpc.WithEndpointURL(o.Endpoint))
			} else {
				opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint))
			}
		}
		if o.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("option \"exporter\": otlp-grpc: %w", err)
		}
		return exp, nil
	case "stdout":
		if o.Endpoint != "" {
			return nil, fmt.Errorf("option \"endpoint\": is %q, but the stdout exporter writes to standard output", o.Endpoint)
		}
		if o.Insecure {
			return nil, fmt.Errorf("option \"insecure\": is true, but the stdout exporter writes to standard output")
		}
		var opts []stdouttrace.Option
		if o.StdoutWriter != nil {
			opts = append(opts, stdouttrace.WithWriter(o.StdoutWriter))
		}
		exp, err := stdouttrace.New(opts...)
		if err != nil {
			return nil, fmt.Errorf("option \"exporter\": stdout: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("option \"exporter\": is %q; want none, otlp-http, otlp-grpc or stdout", o.Exporter)
}

// endpointKind tells a URL (http://collector:4318/v1/traces) from a bare
// host:port, and refuses what is neither.
func endpointKind(ep string) (isURL bool, err error) {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return false, fmt.Errorf("option \"endpoint\": %w", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return false, fmt.Errorf("option \"endpoint\": %q is not an http or https URL with a host", ep)
		}
		return true, nil
	}
	if strings.ContainsAny(ep, "/ ") || !strings.Contains(ep, ":") {
		return false, fmt.Errorf("option \"endpoint\": %q is neither host:port nor a URL", ep)
	}
	return false, nil
}

// newResource is the SDK's default resource (telemetry.sdk.*, and what
// OTEL_RESOURCE_ATTRIBUTES says) with service.name set: name, else
// OTEL_SERVICE_NAME, else the service.name OTEL_RESOURCE_ATTRIBUTES gives,
// else "kernrpc". The environment is read afresh: resource.Default reads
// it once per process.
func newResource(name string) (*resource.Resource, error) {
	env, err := resource.New(context.Background(), resource.WithFromEnv())
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES: what parsed is kept, as
		// resource.Default does.
		otel.Handle(err)
	}
	if name == "" {
		name = strings.TrimSpace(os.Getenv("OTEL_SERVICE_NAME"))
	}
	if name == "" && env != nil {
		if v, ok := env.Set().Value(semconv.ServiceNameKey); ok {
			name = v.AsString()
		}
	}
	if name == "" {
		name = "kernrpc"
	}
	res, err := resource.Merge(resource.Default(), env)
	if err != nil {
		return nil, err
	}
	return resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(name)))
}
