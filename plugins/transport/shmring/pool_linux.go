package shmring

import (
	"unsafe"

	"github.com/kernrpc/kernrpc/internal/bufpool"
)

// Heap buffers serve what does not go through the ring in place: a
// payload for which Buffer found no room, or too large for one record, and
// the frames assembled from chunks. They are kept in power-of-two classes
// from 512 B to 8 MiB, a few per class, so that steady traffic of any size
// allocates nothing; what a burst left is given back about a second after
// it (bufpool's trimming).
var poolLimits = bufpool.Limits{
	MaxSize:     8 << 20,
	ClassBudget: 8 << 20,
	MinPerClass: 1,
	MaxPerClass: 64,
}

// bufferPool is a connection's free list of heap buffers.
type bufferPool struct {
	heap *bufpool.Pool

	// segment is the mapped memory: a slice from it (a payload lent by the
	// peer's ring, passed back to WriteFrame by mistake) is never kept.
	segLo, segHi uintptr
}

func newBufferPool(seg []byte) bufferPool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(seg)))
	return bufferPool{heap: bufpool.New(poolLimits), segLo: lo, segHi: lo + uintptr(len(seg))}
}

// get returns an empty buffer with room for at least size bytes.
func (p *bufferPool) get(size int) []byte { return p.heap.Get(size) }

// put keeps b for reuse unless it lies in the segment.
func (p *bufferPool) put(b []byte) {
	if a := uintptr(unsafe.Pointer(unsafe.SliceData(b))); a >= p.segLo && a < p.segHi {
		return
	}
	p.heap.Put(b)
}
