package headerstamp_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests run servers and clients through this plugin: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
