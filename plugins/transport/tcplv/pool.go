package tcplv

import (
	"sync/atomic"

	"github.com/kernrpc/kernrpc/internal/bufpool"
	"github.com/kernrpc/kernrpc/kernel"
)

// Buffers are kept in power-of-two size classes from 512 B to 1 MiB.
// Those up to ownMax come from the connection's own pool, each class
// keeping about 1 MiB: small classes keep more buffers, as many calls are
// in flight at once. Larger ones come from a pool the transport's
// connections share, each class keeping about 16 MiB (at most 256
// buffers): a connection moving large messages on many streams, or many
// calls, has dozens out at once, queued for the writer or held by the
// engine. Under the per-connection bound of 1 MiB a class, most of them
// were dropped and allocated again, and meanwhile the runtime had handed
// their pages back to the kernel: 3.5 page faults for each 64 KiB message
// a stream's server sent. A free list never keeps more buffers than were
// out at once, up to those bounds, and gives back what it did not need
// for a second or so (bufpool's trimming); shared, they do not grow with
// the connections.
const (
	maxPooledSize = 1 << 20
	ownMax        = 32 << 10
	maxFreeFrames = 256
)

var (
	ownLimits    = bufpool.Limits{MaxSize: ownMax, ClassBudget: 1 << 20, MinPerClass: 2, MaxPerClass: 256}
	sharedLimits = bufpool.Limits{MaxSize: maxPooledSize, ClassBudget: 16 << 20, MinPerClass: 2, MaxPerClass: 256}
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
	own    *bufpool.Pool // buffers up to ownMax
	shared *bufpool.Pool // larger ones: the transport's
	frames bufpool.FreeList[*pooledFrame]
	// spare is one small frame kept whole, with its buffer, for the next
	// small frame read: a reader whose frames are released as soon as they
	// are read (a stream's small messages, copied out on arrival) then
	// pays an atomic swap each way instead of two free lists' locks.
	spare atomic.Pointer[pooledFrame]
	// spareBuf is one buffer of the smallest class kept whole in the same
	// way, for the next small payload encoded: a sender of small messages
	// (a stream's) takes it from Buffer and gives it back once its frame
	// is copied into the write queue, each a swap instead of a lock.
	spareBuf atomic.Pointer[[bufpool.MinSize]byte]
}

func (p *bufferPool) init(shared *bufpool.Pool) {
	p.own, p.shared = bufpool.New(ownLimits), shared
	p.frames.Limit = maxFreeFrames
}

// Get returns an empty buffer with room for at least size bytes.
func (p *bufferPool) Get(size int) []byte {
	// Loaded first: a swap writes the line even when it finds nothing.
	if size <= bufpool.MinSize && p.spareBuf.Load() != nil {
		if b := p.spareBuf.Swap(nil); b != nil {
			return b[:0]
		}
	}
	if size > ownMax {
		return p.shared.Get(size)
	}
	return p.own.Get(size)
}

// Put keeps b for reuse, in the pool its capacity belongs to.
func (p *bufferPool) Put(b []byte) {
	if cap(b) == bufpool.MinSize && p.spareBuf.Load() == nil &&
		p.spareBuf.CompareAndSwap(nil, (*[bufpool.MinSize]byte)(b[:bufpool.MinSize])) {
		return
	}
	if cap(b) > ownMax {
		p.shared.Put(b)
		return
	}
	p.own.Put(b)
}

func (p *bufferPool) getFrame(c *conn) *pooledFrame {
	if pf, ok := p.frames.Get(); ok {
		return pf
	}
	return &pooledFrame{c: c}
}

// putFrame recycles pf's buffer (if it still owns one) and pf itself.
func (p *bufferPool) putFrame(pf *pooledFrame) {
	pf.f.Reset()
	if cap(pf.body) == bufpool.MinSize && p.spare.Load() == nil && p.spare.CompareAndSwap(nil, pf) {
		return
	}
	body := pf.body
	pf.body = nil
	p.Put(body)
	p.frames.Put(pf)
}

// takeSpare returns the spare frame, with a buffer of bufpool.MinSize,
// if there is one.
func (p *bufferPool) takeSpare() *pooledFrame {
	if p.spare.Load() == nil {
		return nil
	}
	return p.spare.Swap(nil)
}
