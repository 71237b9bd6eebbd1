package faulty_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Delayed frames are sent by a goroutine of each connection's own: none
// may outlive its connection.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
