package oteltracing_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options map[string]any
	}{
		{"defaults", nil},
		{"attempt spans", map[string]any{"span": "attempt"}},
		{"sampler never", map[string]any{"sampler": "never"}},
		{"ratio 0", map[string]any{"sampler": "ratio", "ratio": 0}},
		{"own provider", map[string]any{"exporter": "otlp-http", "endpoint": "127.0.0.1:1", "insecure": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plugintest.Filter(t, oteltracing.Factory, plugintest.FilterConfig{
				Options:       tc.options,
				BadOptions:    map[string]any{"sampler": "sometimes"},
				BadOptionsKey: "sampler",
			})
		})
	}
}
