package leastload_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The conformance suite picks from many goroutines, and the slow-instance
// test runs servers and clients of the engine: none may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
