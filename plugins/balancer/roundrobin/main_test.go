package roundrobin_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The concurrency tests and the conformance suite pick from many goroutines:
// none may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
