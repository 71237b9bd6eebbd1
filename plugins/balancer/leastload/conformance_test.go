package leastload_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugins/balancer/leastload"
	"github.com/kernrpc/kernrpc/plugintest"
)

// Power of two choices promises no exact spread (SpreadAny); the spread by
// load is tested in leastload_test.go and slow_test.go.
func TestConformance(t *testing.T) {
	plugintest.Balancer(t, leastload.Factory, plugintest.BalancerConfig{Spread: plugintest.SpreadAny})
}
