package bufpool

import "sync"

// FreeList is a bounded stack of values kept for reuse (buffers, frames).
// Once grown to its limit it allocates nothing on Put, unlike a sync.Pool,
// which boxes each value that is not a pointer. The zero value keeps
// nothing; set Limit first. It is safe for concurrent use.
type FreeList[T any] struct {
	Limit int // how many values it keeps at most

	mu    sync.Mutex
	items []T
	low   int // the fewest items held since the last trim
}

// Get returns the value put last, or false when there is none.
func (l *FreeList[T]) Get() (T, bool) {
	var zero T
	l.mu.Lock()
	n := len(l.items)
	if n == 0 {
		l.low = 0
		l.mu.Unlock()
		return zero, false
	}
	v := l.items[n-1]
	l.items[n-1] = zero // let the collector have what v points to once v is dropped
	l.items = l.items[:n-1]
	l.low = min(l.low, n-1)
	l.mu.Unlock()
	return v, true
}

// Put keeps v unless the list is full.
func (l *FreeList[T]) Put(v T) {
	l.mu.Lock()
	if len(l.items) < l.Limit {
		l.items = append(l.items, v)
	}
	l.mu.Unlock()
}
