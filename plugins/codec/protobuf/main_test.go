package protobuf_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The conformance suite and the concurrency tests run goroutines: none may
// outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
