package timeout_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests run the engine's servers and clients through this filter, with its
// timers and any calls it makes at once: none may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
