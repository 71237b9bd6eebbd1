package enginetest

import (
	"log/slog"
	"testing"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
)

// LogBuffer is what a test's logger writes to while servers and clients
// log from goroutines of their own.
type LogBuffer = syncbuf.Buffer

// DefaultLog points the default slog logger at a fresh buffer, as text
// records at INFO and above, until t ends, and returns the buffer: servers
// and clients take their logger from slog.Default when they are made.
// Tests that use it must not run in parallel.
func DefaultLog(t testing.TB) *LogBuffer {
	logs := new(LogBuffer)
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return logs
}
