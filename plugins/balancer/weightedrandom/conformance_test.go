package weightedrandom_test

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugins/balancer/weightedrandom"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Balancer(t, weightedrandom.Factory, plugintest.BalancerConfig{Spread: plugintest.SpreadWeighted})
}
