package shmring

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
)

// The read side: one goroutine at a time inside ReadFrame takes records
// off the ring the peer writes, lending a frame that fit in one record in
// place until its Release and assembling a chunked one in a pooled buffer.

// ReadFrame returns the next frame. A frame that fit in one record is
// lent from the ring in place until its Release; a chunked one was
// assembled in a pooled buffer. When ctx ends first it returns ctx's
// error and the connection stays usable.
func (c *conn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if !c.acquire() {
		return nil, c.Err()
	}
	c.readMu.Lock()
	// One deferred function: with two, this function's returns are too
	// many for the compiler to open-code them, which costs every read.
	defer func() {
		c.readMu.Unlock()
		if c.peerGone.Load() {
			c.leftIfDrained() // the watcher may have found readMu held
		}
		c.releaseRef()
	}()
	in := &c.in
	for {
		if err := c.Err(); err != nil {
			return nil, err
		}
		if in.rd == in.head {
			if err := in.loadHead(); err != nil {
				return nil, c.protocolError(err)
			}
		}
		if in.rd == in.head {
			if c.peerGone.Load() {
				if err := in.loadHead(); err != nil {
					return nil, c.protocolError(err)
				}
				if in.rd == in.head {
					return nil, c.peerLeft("it closed the connection or its process exited")
				}
				continue
			}
			if err := c.waitData(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if f, err := c.readRecord(); f != nil || err != nil {
			return f, err
		}
	}
}

// readRecord consumes the record at the read position and returns the
// frame it completes, if any.
func (c *conn) readRecord() (*kernel.Frame, error) {
	in := &c.in
	rec, err := in.parse()
	if err != nil {
		return nil, c.protocolError(err)
	}
	start, end := in.rd, in.rd+uint64(rec.size)
	in.rd = end
	switch rec.kind {
	case kindFrame:
		rf := in.getFrame(c)
		if err := in.decode(rec.content, &rf.f); err != nil {
			in.putFrame(rf)
			in.consumed(end)
			return nil, c.protocolError(err)
		}
		if rf.f.Type == kernel.FramePing || rf.f.Type == kernel.FramePong {
			// Liveness is the socket's job; a peer's probe needs no answer.
			in.putFrame(rf)
			in.consumed(end)
			return nil, nil
		}
		c.refs.Add(1) // the loan's; the reader's own reference keeps refs above zero
		rf.seq = in.hold(start, end)
		rf.f.SetOwner(rf)
		return &rf.f, nil
	case kindFirstChunk, kindChunk:
		f, err := c.assemble(rec)
		in.consumed(end) // only now: the piece is copied out
		return f, err
	case kindAbort:
		in.consumed(end)
		c.pool.put(in.asm)
		in.asm = nil
		return nil, nil
	case kindEnd:
		in.consumed(end)
		return nil, c.peerLeft("it closed its side of the connection")
	default: // padding and wrap markers
		in.consumed(end)
		return nil, nil
	}
}

// assemble adds a chunk to the frame being assembled and returns the
// frame once it is whole.
func (c *conn) assemble(rec record) (*kernel.Frame, error) {
	in := &c.in
	if rec.kind == kindFirstChunk {
		if in.asm != nil {
			return nil, c.protocolError(corrupt("a chunked frame began before the previous one ended"))
		}
		n, err := kernel.ReadFrameLength(rec.content, in.maxFrame)
		if err != nil {
			return nil, c.protocolError(err)
		}
		in.asmLen = kernel.FramePrefixLen + n
		in.asm = c.pool.get(in.asmLen)[:0]
	} else if in.asm == nil {
		return nil, c.protocolError(corrupt("a piece of a chunked frame arrived without its beginning"))
	}
	if len(in.asm)+len(rec.content) > in.asmLen {
		return nil, c.protocolError(corrupt("the pieces of a chunked frame add up to more than its length %d", in.asmLen-kernel.FramePrefixLen))
	}
	in.asm = append(in.asm, rec.content...)
	if len(in.asm) < in.asmLen {
		return nil, nil
	}
	rf := in.getFrame(c)
	rf.buf, in.asm = in.asm, nil
	err := in.decode(rf.buf, &rf.f)
	if err == nil && rf.f.Type != kernel.FramePing && rf.f.Type != kernel.FramePong {
		rf.f.SetOwner(rf)
		return &rf.f, nil
	}
	rf.ReleaseFrame(&rf.f)
	if err != nil {
		return nil, c.protocolError(err)
	}
	return nil, nil
}

// Buffered reports how many published bytes ReadFrame can take without
// waiting; only the reader may call it.
func (c *conn) Buffered() int {
	if !c.acquire() {
		return 0
	}
	defer c.releaseRef()
	h := c.in.r.head.Load()
	if h < c.in.rd || h-c.in.rd > c.in.size {
		return 0
	}
	return int(h - c.in.rd)
}

// ringFrame is a frame ReadFrame handed out and its owner: Release finds
// its record, or its assembly buffer, without a lookup.
type ringFrame struct {
	f   kernel.Frame
	c   *conn
	seq uint64 // the record it is lent from
	buf []byte // a chunked frame's assembled bytes; nil when lent from the ring
}

// ReleaseFrame lets the writer reuse the frame's record (or recycles its
// buffer) and keeps the frame for the next read.
func (rf *ringFrame) ReleaseFrame(*kernel.Frame) {
	c := rf.c
	if rf.buf != nil {
		c.pool.put(rf.buf)
		rf.buf = nil
		c.in.putFrame(rf)
		return
	}
	c.in.release(rf.seq)
	c.in.putFrame(rf)
	c.releaseRef()
}
