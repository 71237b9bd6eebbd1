package roundrobin_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Balancer(t, roundrobin.Factory, plugintest.BalancerConfig{Spread: plugintest.SpreadRoundRobin})
}
