package etcdtest

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
	"github.com/kernrpc/kernrpc/plugintest"
)

// TestConformance certifies the plugin against a real etcd.
func TestConformance(t *testing.T) {
	srv := Start(t)
	t.Logf("embedded etcd %s at %s", Version(), srv.Endpoint())
	plugintest.Registry(t, etcd.Factory, plugintest.RegistryConfig{
		// dial_timeout is the default: beside a fuzzing run, the
		// embedded etcd once took over 2s to grant a lease.
		Options: map[string]any{
			"endpoints":    []any{srv.Endpoint()},
			"prefix":       testPrefix(t),
			"dial_timeout": "5s",
			"ttl":          "1s",
			// Load reports held back at most this long show within
			// Tolerance (Load/*).
			"load_report_interval": "200ms",
		},
		TTL: time.Second,
		// etcd's lessor looks for expired leases every 500ms.
		Tolerance: 2 * time.Second,
		// A value stays well under etcd's default request limit (1.5 MiB)
		// with its key and the rest of the JSON.
		MaxMetadataValue: 1 << 20,
	})
}
