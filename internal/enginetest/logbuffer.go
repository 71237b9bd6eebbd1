package enginetest

import (
	"bytes"
	"sync"
)

// LogBuffer is what a test's logger writes to while servers and clients
// log from goroutines of their own: a bytes.Buffer behind a lock.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything logged so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
