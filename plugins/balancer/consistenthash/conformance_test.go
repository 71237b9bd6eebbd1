package consistenthash_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugins/balancer/consistenthash"
	"github.com/kernrpc/kernrpc/plugintest"
)

// plugintest's picks carry no call metadata, so the suite certifies the
// balancer with fallback random: every pick takes the keyless path. The
// ring itself is tested in consistenthash_test.go: picks only from the
// current set, unchanged after Updates, the same key to the same instance,
// and the keys that move when the set changes.
func TestConformance(t *testing.T) {
	plugintest.Balancer(t, consistenthash.Factory, plugintest.BalancerConfig{
		Options: map[string]any{"fallback": "random"},
		Spread:  plugintest.SpreadAny,
	})
}
