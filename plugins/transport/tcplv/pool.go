package tcplv

import (
	"math/bits"
	"sync"

	"github.com/kernrpc/kernrpc/kernel"
)

// Buffers are kept in power-of-two size classes from 512 B to 1 MiB. A
// free list of []byte allocates nothing on put (sync.Pool would box each
// slice header), and a per-connection list is only contended by that
// connection's callers.
const (
	minClassShift = 9
	numClasses    = 12
	maxPooledSize = 1 << (minClassShift + numClasses - 1)
	// classBudget is roughly how many bytes each class may keep; small
	// classes keep more buffers, as many calls are in flight at once.
	classBudget   = 1 << 20
	maxPerClass   = 256
	minPerClass   = 2
	maxFreeFrames = 256
)

// pooledFrame is a frame handed out by ReadFrame with the buffer its
// payload lives in. It is the frame's owner, so Release finds the buffer
// without a lookup.
type pooledFrame struct {
	f    kernel.Frame
	body []byte
	c    *conn
}

var _ kernel.FrameOwner = (*pooledFrame)(nil)

// ReleaseFrame gives the frame and its buffer back to the connection.
func (pf *pooledFrame) ReleaseFrame(*kernel.Frame) { pf.c.pool.putFrame(pf) }

// bufferPool holds a connection's free buffers and frames.
type bufferPool struct {
	mu     sync.Mutex
	free   [numClasses][][]byte
	frames []*pooledFrame
}

// get returns an empty buffer with capacity for at least size bytes.
func (p *bufferPool) get(size int) []byte {
	if size > maxPooledSize {
		return make([]byte, 0, size)
	}
	k := 0
	if size > 1<<minClassShift {
		k = bits.Len(uint(size-1)) - minClassShift
	}
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

// put keeps b for reuse in the largest class it can serve. Buffers too
// small to matter or too large to hoard are left to the garbage collector.
func (p *bufferPool) put(b []byte) {
	c := cap(b)
	if c < 1<<minClassShift || c > maxPooledSize {
		return
	}
	k := bits.Len(uint(c)) - 1 - minClassShift
	limit := min(max(classBudget>>(k+minClassShift), minPerClass), maxPerClass)
	p.mu.Lock()
	if len(p.free[k]) < limit {
		p.free[k] = append(p.free[k], b[:0])
	}
	p.mu.Unlock()
}

func (p *bufferPool) getFrame(c *conn) *pooledFrame {
	p.mu.Lock()
	if n := len(p.frames); n > 0 {
		pf := p.frames[n-1]
		p.frames[n-1] = nil
		p.frames = p.frames[:n-1]
		p.mu.Unlock()
		return pf
	}
	p.mu.Unlock()
	return &pooledFrame{c: c}
}

// putFrame recycles pf's buffer (if it still owns one) and pf itself.
func (p *bufferPool) putFrame(pf *pooledFrame) {
	body := pf.body
	pf.body = nil
	pf.f.Reset()
	p.put(body)
	p.mu.Lock()
	if len(p.frames) < maxFreeFrames {
		p.frames = append(p.frames, pf)
	}
	p.mu.Unlock()
}
