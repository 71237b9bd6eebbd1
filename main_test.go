package kernrpc_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The engine starts goroutines per connection, dial, watch and timer:
// none may outlive the test that started it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
