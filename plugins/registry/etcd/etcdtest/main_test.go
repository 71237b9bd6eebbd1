package etcdtest

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// long runs the steady-state write count for a full minute instead of a
// few seconds.
var long = flag.Bool("etcd.long", false, "run the steady keepalive write count for a minute")

// Registries, watches, elections and the embedded servers all start
// goroutines; none may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
