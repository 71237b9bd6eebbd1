package consistenthash_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/consistenthash"
	"github.com/kernrpc/kernrpc/plugintest"
)

// Most of plugintest's picks carry no call metadata, so the suite
// certifies the balancer with fallback random: those take the keyless
// path. The Keyed checks pick with the key (a value of its own each
// time), so the ring's path is held to the same properties. The ring
// itself is tested in consistenthash_test.go too: the same key to the
// same instance, and the keys that move when the set changes.
func TestConformance(t *testing.T) {
	plugintest.Balancer(t, consistenthash.Factory, plugintest.BalancerConfig{
		Options:  map[string]any{"fallback": "random"},
		Spread:   plugintest.SpreadAny,
		Metadata: kernel.Metadata{"x-hash-key": "user"},
	})
}
