// Package syncbuf is a bytes.Buffer behind a lock, for tests whose logger
// or command writes from goroutines of its own while the test reads. Only
// tests import it; it imports the standard library alone, so that any
// package's tests can, the engine's and the transports' alike.
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is safe for one writer and readers at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Take is everything written since the last Take, which it empties.
func (b *Buffer) Take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.b.String()
	b.b.Reset()
	return s
}

// CancelOn is a Buffer that calls Cancel once what was written holds At:
// a test's output that interrupts the run at a known step.
type CancelOn struct {
	Buffer
	At     string
	Cancel func()
}

func (w *CancelOn) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.String(), w.At) {
		w.Cancel()
	}
	return n, err
}
