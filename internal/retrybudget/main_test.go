package retrybudget

import (
	"testing"

	"go.uber.org/goleak"
)

// The concurrency test spends the budget from many goroutines: none may
// outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
