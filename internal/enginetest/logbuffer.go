package enginetest

import "github.com/kernrpc/kernrpc/internal/syncbuf"

// LogBuffer is what a test's logger writes to while servers and clients
// log from goroutines of their own.
type LogBuffer = syncbuf.Buffer
