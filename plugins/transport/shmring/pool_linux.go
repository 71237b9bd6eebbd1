package shmring

import (
	"math/bits"
	"sync"
	"unsafe"
)

// Heap buffers serve what does not go through the ring in place: a
// payload for which Buffer found no room, or too large for one record, and
// the frames assembled from chunks. They are kept in power-of-two classes
// from 512 B to 8 MiB, a few per class, so that steady traffic of any size
// allocates nothing.
const (
	minClassShift = 9
	numClasses    = 15
	maxPooledSize = 1 << (minClassShift + numClasses - 1)
	classBudget   = 8 << 20 // about how many bytes each class may keep
	maxPerClass   = 64
)

type bufferPool struct {
	// segment is the mapped memory: a slice from it (a payload lent by the
	// peer's ring, passed back to WriteFrame by mistake) is never kept.
	segLo, segHi uintptr

	mu   sync.Mutex
	free [numClasses][][]byte
}

func (p *bufferPool) class(size int) int {
	if size <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(size-1)) - minClassShift
}

// get returns an empty buffer with room for at least size bytes.
func (p *bufferPool) get(size int) []byte {
	if size > maxPooledSize {
		return make([]byte, 0, size)
	}
	k := p.class(size)
	p.mu.Lock()
	if n := len(p.free[k]); n > 0 {
		b := p.free[k][n-1]
		p.free[k][n-1] = nil
		p.free[k] = p.free[k][:n-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	return make([]byte, 0, 1<<(k+minClassShift))
}

// put keeps b for reuse in the largest class it can serve.
func (p *bufferPool) put(b []byte) {
	c := cap(b)
	if c < 1<<minClassShift || c > maxPooledSize {
		return
	}
	if a := uintptr(unsafe.Pointer(unsafe.SliceData(b))); a >= p.segLo && a < p.segHi {
		return
	}
	k := bits.Len(uint(c)) - 1 - minClassShift
	limit := min(max(classBudget>>(k+minClassShift), 1), maxPerClass)
	p.mu.Lock()
	if len(p.free[k]) < limit {
		p.free[k] = append(p.free[k], b[:0])
	}
	p.mu.Unlock()
}
