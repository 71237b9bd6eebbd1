package consistenthash_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The conformance suite picks from many goroutines: none may outlive the
// test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
