// Package bufpool is the free list of byte buffers the transports lend
// from Buffer and recycle after a write or a released read: power-of-two
// size classes, each keeping a bounded number of buffers and giving back
// after a GC cycle those it had no use for over the last second or more
// (trim.go).
//
// It is a free list of []byte rather than a sync.Pool because putting a
// slice into a sync.Pool boxes its header, one allocation per Put, and the
// transports promise allocation-free steady traffic. A Pool for small
// buffers belongs to one connection, so its lock is only contended by that
// connection's callers; tcp-lv shares one for large buffers among a
// transport's connections, where each lock taken is small beside the copy
// of tens of KiB the buffer is for.
package bufpool

import (
	"fmt"
	"math/bits"
)

// minClassShift makes 512 B the smallest class: a smaller buffer costs
// less to allocate than to track.
const minClassShift = 9

// MinSize is the capacity of the smallest class. Put drops buffers with
// less capacity, and Get never returns less.
const MinSize = 1 << minClassShift

// Limits sizes a Pool.
type Limits struct {
	// MaxSize is the largest class, a power of two of at least MinSize.
	// Get allocates a larger request exactly, and Put drops it: buffers
	// that large are rare and too costly to hoard.
	MaxSize int
	// ClassBudget is about how many bytes each class may keep, so small
	// classes keep more buffers, as many small calls are in flight at
	// once, and large ones fewer.
	ClassBudget int
	// MinPerClass and MaxPerClass bound the buffers a class keeps, whatever
	// ClassBudget says.
	MinPerClass, MaxPerClass int
}

// Pool is a free list of buffers in size classes from MinSize to
// Limits.MaxSize. It is safe for concurrent use.
type Pool struct {
	maxSize int
	classes []FreeList[[]byte] // one per size class, smallest first
}

// New returns an empty pool sized by l. Limits are fixed by the code that
// uses the pool, so invalid ones are a bug: New panics.
func New(l Limits) *Pool {
	if l.MaxSize < MinSize || l.MaxSize&(l.MaxSize-1) != 0 {
		panic(fmt.Sprintf("bufpool: MaxSize %d is not a power of two of at least %d", l.MaxSize, MinSize))
	}
	if l.MinPerClass < 0 || l.MaxPerClass < l.MinPerClass {
		panic(fmt.Sprintf("bufpool: per-class bounds [%d, %d] are not a range", l.MinPerClass, l.MaxPerClass))
	}
	p := &Pool{
		maxSize: l.MaxSize,
		classes: make([]FreeList[[]byte], bits.Len(uint(l.MaxSize))-minClassShift),
	}
	for k := range p.classes {
		p.classes[k].Limit = min(max(l.ClassBudget>>(k+minClassShift), l.MinPerClass), l.MaxPerClass)
	}
	autoTrim(p)
	return p
}

// Get returns an empty buffer with capacity for at least size bytes.
func (p *Pool) Get(size int) []byte {
	if size > p.maxSize {
		return make([]byte, 0, size)
	}
	k := 0
	if size > MinSize {
		k = bits.Len(uint(size-1)) - minClassShift
	}
	if b, ok := p.classes[k].Get(); ok {
		return b
	}
	return make([]byte, 0, 1<<(k+minClassShift))
}

// Put keeps b for reuse in the largest class it can serve, unless that
// class is full. Buffers too small to matter or too large to hoard are left
// to the garbage collector. The caller must not touch b afterwards.
func (p *Pool) Put(b []byte) {
	n := cap(b)
	if n < MinSize || n > p.maxSize {
		return
	}
	p.classes[bits.Len(uint(n))-1-minClassShift].Put(b[:0])
}
