package faulty_test

import (
	"math"
	"testing"

	"github.com/kernrpc/kernrpc/plugins/transport/faulty"
	_ "github.com/kernrpc/kernrpc/plugins/transport/tcplv"
	"github.com/kernrpc/kernrpc/plugintest"
)

// With no fault on, faulty must be the transport it wraps.
func TestConformance(t *testing.T) {
	plugintest.Transport(t, faulty.Factory, plugintest.TransportConfig{})
}

// A fault armed on both sides but never reached wraps every connection,
// so the suite runs through the wrapper's own paths: writes, reads,
// optional interfaces, Close.
func TestConformanceWrappedWithNoFaultReached(t *testing.T) {
	plugintest.Transport(t, faulty.Factory, plugintest.TransportConfig{
		Options: map[string]any{"reset_after": math.MaxInt},
	})
}
