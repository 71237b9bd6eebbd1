package echopb_test

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

// The example runs a server and a client in this process: none of their
// goroutines may outlive it. Its informational logs would only bury its
// output.
func TestMain(m *testing.M) {
	slog.SetLogLoggerLevel(slog.LevelWarn)
	goleak.VerifyTestMain(m)
}
