package memory_test

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/plugins/registry/memory"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Registry(t, memory.Factory, plugintest.RegistryConfig{
		// A namespace of its own, so that the suite's registries meet only
		// each other.
		Options: map[string]any{"namespace": "plugintest-" + t.Name()},
		TTL:     500 * time.Millisecond,
	})
}
