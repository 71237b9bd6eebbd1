package tcplv

import (
	"sync/atomic"

	"github.com/kernrpc/kernrpc/internal/bufpool"
	"github.com/kernrpc/kernrpc/kernel"
)

// Buffers are kept in power-of-two size classes from 512 B to 1 MiB, each
// class keeping about 1 MiB: small classes keep more buffers, as many
// calls are in flight at once.
const (
	maxPooledSize = 1 << 20
	maxFreeFrames = 256
)

var poolLimits = bufpool.Limits{
	MaxSize:     maxPooledSize,
	ClassBudget: 1 << 20,
	MinPerClass: 2,
	MaxPerClass: 256,
}

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
	*bufpool.Pool
	frames bufpool.FreeList[*pooledFrame]
	// spare is one small frame kept whole, with its buffer, for the next
	// small frame read: a reader whose frames are released as soon as they
	// are read (a stream's small messages, copied out on arrival) then
	// pays an atomic swap each way instead of two free lists' locks.
	spare atomic.Pointer[pooledFrame]
}

func (p *bufferPool) init() {
	p.Pool = bufpool.New(poolLimits)
	p.frames.Limit = maxFreeFrames
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
