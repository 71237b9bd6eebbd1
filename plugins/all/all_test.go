package all_test

import (
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

// A config that leaves every plugin out must build in a binary that imports
// all: each kernel default is one of the built-in plugins.
func TestEveryDefaultIsRegistered(t *testing.T) {
	registered := map[kernel.Kind]map[string]bool{}
	for _, p := range kernel.Plugins() {
		if registered[p.Kind] == nil {
			registered[p.Kind] = map[string]bool{}
		}
		registered[p.Kind][p.Name] = true
	}
	for _, want := range []struct {
		kind kernel.Kind
		name string
	}{
		{kernel.KindTransport, kernrpc.DefaultTransport},
		{kernel.KindCodec, kernrpc.DefaultCodec},
		{kernel.KindRegistry, kernrpc.DefaultRegistry},
		{kernel.KindBalancer, kernrpc.DefaultBalancer},
	} {
		if !registered[want.kind][want.name] {
			t.Errorf("default %s %q is not registered by plugins/all", want.kind, want.name)
		}
	}
}
