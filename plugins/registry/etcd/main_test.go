package etcd_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The dead-etcd tests dial and give up; no client goroutine may outlive
// its registry.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
