package prometheus_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests start listeners, HTTP servers and the engine's servers and
// clients: none of their goroutines may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
