package faultharness_test

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Injected faults make the engine log every connection it loses; the
	// harness's figures say what happened.
	slog.SetLogLoggerLevel(slog.LevelError)
	goleak.VerifyTestMain(m)
}
