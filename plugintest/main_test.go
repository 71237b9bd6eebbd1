package plugintest

import (
	"testing"

	"go.uber.org/goleak"
)

// The self-tests run every suite against broken plugins, whose calls and
// watches run on goroutines: none may outlive the test, even when a suite
// fails the plugin. Two broken registries leak on purpose, since leaking is
// their defect and Registry/Leaks must catch it; their goroutines, and only
// those, are let be.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/kernrpc/kernrpc/plugintest.registryBlockingSend"),
		goleak.IgnoreTopFunction("github.com/kernrpc/kernrpc/plugintest.(*registryOwnKeeper).Register.func1"),
	)
}
