package shmring

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/kernrpc/kernrpc/internal/bufpool"
	"github.com/kernrpc/kernrpc/kernel"
)

// The reading end of a ring (ring_linux.go has the records and the
// writing end).

// consumer reads one direction. Records are read in order by the one
// goroutine holding the reading role; frames lent from the ring are
// released in any order, and the tail the writer may reuse up to moves
// over released records only.
type consumer struct {
	r        ringView
	size     uint64
	maxFrame int
	limits   kernel.FrameLimits // on the metadata of frames read
	wake     *peerWaker         // the connection's: wakes the peer's writers when the tail moves

	// The reader's, under conn.readMu.
	rd     uint64 // the next record
	head   uint64 // published, as last loaded and validated
	in     kernel.Interner
	fields []byte // a private copy of the frame header being decoded
	asm    []byte // the chunked frame being assembled; nil when none
	asmLen int    // its total length

	mu       sync.Mutex
	tail     uint64          // released up to here (stored to r.tail)
	held     fifo[heldEntry] // read records the tail has not passed, in order
	heldBase uint64          // sequence number of held's first entry
	nextSeq  uint64
	passed   map[uint64]int // listed records the tail passed: sequence number → table entry
	free     []int          // free entries of the held table
	frames   bufpool.FreeList[*ringFrame]
}

type heldEntry struct {
	start, end uint64
	released   bool
	listed     int // 1 + its entry in the held table, once listed; 0 before
}

func newConsumer(r ringView, maxFrame int) consumer {
	free := make([]int, maxHeld)
	for i := range free {
		free[i] = maxHeld - 1 - i
	}
	return consumer{r: r, size: uint64(len(r.data)), maxFrame: maxFrame, passed: map[uint64]int{}, free: free,
		frames: bufpool.FreeList[*ringFrame]{Limit: maxFreeFrames}}
}

// loadHead reads the writer's publish index, which must not go back nor
// run more than a ring ahead of what this side released.
func (c *consumer) loadHead() error {
	h := c.r.head.Load()
	if h < c.head || h-c.rd > c.size {
		return corrupt("the writer's head moved to %d (reading at %d, ring of %d)", h, c.rd, c.size)
	}
	c.head = h
	return nil
}

// record is what the record at rd says, checked against the ring.
type record struct {
	kind    uint8
	size    uint32
	content []byte // frames and chunks: capped at its end, so appending cannot reach the next record
}

// parse reads and checks the record at rd; head > rd. Every field is read
// from shared memory once and checked before use: the peer can write
// anything there, at any time.
func (c *consumer) parse() (record, error) {
	off := c.rd % c.size
	avail, toEnd := c.head-c.rd, c.size-off
	w := c.r.data[off : off+wordLen]
	size, kind, zero := ne.Uint32(w), w[4], uint32(w[5])<<16|uint32(w[6])<<8|uint32(w[7])
	switch {
	case zero != 0:
		return record{}, corrupt("record at %d has bytes 5-7 of its first word set (%#06x); they are zero", c.rd, zero)
	case size < wordLen || size%8 != 0:
		return record{}, corrupt("record of %d bytes at %d: want a positive multiple of 8", size, c.rd)
	case uint64(size) > avail || uint64(size) > toEnd:
		return record{}, corrupt("record of %d bytes at %d runs past what was published (%d) or the ring's end (%d)", size, c.rd, avail, toEnd)
	}
	rec := record{kind: kind, size: size}
	switch kind {
	case kindPad, kindAbort, kindEnd:
	case kindWrap:
		if uint64(size) != toEnd {
			return record{}, corrupt("wrap marker of %d bytes at %d does not reach the ring's end (%d)", size, c.rd, toEnd)
		}
	case kindFrame, kindFirstChunk, kindChunk:
		if size < recordHeaderLen {
			return record{}, corrupt("content record of %d bytes at %d is shorter than its header", size, c.rd)
		}
		if uint64(size) > c.size/4 {
			// A writer sends a larger frame as chunks; a frame record this
			// large, lent out and listed as held, would be refused by the
			// writer's own check of the table.
			return record{}, corrupt("content record of %d bytes at %d is larger than a quarter of the ring (%d)", size, c.rd, c.size/4)
		}
		start, length := ne.Uint32(c.r.data[off+8:]), ne.Uint32(c.r.data[off+12:])
		if start < recordHeaderLen || start > size || length > size-start {
			return record{}, corrupt("content [%d, +%d) of the %d-byte record at %d is outside it", start, length, size, c.rd)
		}
		b, e := off+uint64(start), off+uint64(start)+uint64(length)
		rec.content = c.r.data[b:e:e]
	default:
		return record{}, corrupt("record of unknown kind %d at %d", kind, c.rd)
	}
	return rec, nil
}

// decode decodes the kernel frame in b, which must hold exactly one, into
// f. The header is decoded from a private copy, so that a peer rewriting
// it meanwhile can confuse nothing but its own frame; the payload stays
// where it is (capped, so appending to it allocates).
func (c *consumer) decode(b []byte, f *kernel.Frame) error {
	n, err := kernel.ReadFrameLength(b, c.maxFrame)
	if err != nil {
		return err
	}
	if kernel.FramePrefixLen+n != len(b) {
		return corrupt("frame length %d does not match its record's content of %d bytes", n, len(b)-kernel.FramePrefixLen)
	}
	body := b[kernel.FramePrefixLen:]
	hl := kernel.FrameFixedLen + int(binary.BigEndian.Uint32(body[12:16]))
	if hl < kernel.FrameFixedLen || hl > len(body) {
		return fmt.Errorf("%w: fields length runs past the frame end", kernel.ErrMalformedFrame)
	}
	c.fields = append(c.fields[:0], body[:hl]...)
	err = c.limits.Decode(c.fields, f, &c.in)
	if cap(c.fields) > maxKeptHeader {
		// One frame with a large header (a long status message, metadata
		// under a raised max_metadata_bytes) must not leave a buffer that
		// large with the connection for good; Decode copied what it kept.
		c.fields = nil
	}
	if err != nil {
		return err
	}
	f.Payload = body[hl:len(body):len(body)]
	return nil
}

// hold records that the record [start, end) is read but lent out, and
// returns its sequence number for release.
func (c *consumer) hold(start, end uint64) uint64 {
	c.mu.Lock()
	seq := c.nextSeq
	c.nextSeq++
	c.held.push(heldEntry{start: start, end: end})
	c.mu.Unlock()
	return seq
}

// consumed releases at once a record nothing is lent from.
func (c *consumer) consumed(end uint64) {
	c.mu.Lock()
	if c.held.n > 0 {
		// Released, but the tail waits for the lent records before it.
		c.held.push(heldEntry{end: end, released: true})
		c.nextSeq++
		c.mu.Unlock()
		return
	}
	c.advanceLocked(end)
	c.mu.Unlock()
	c.wake.ifSleeping(c.r.writer, wakeWriters)
}

// release lets the writer reuse the record seq once every record before
// it is released too, or at once if it is listed.
func (c *consumer) release(seq uint64) {
	c.mu.Lock()
	if seq < c.heldBase {
		// Listed, and passed by the tail: freeing its entry gives the
		// writer room without moving the tail, so it must be woken here
		// too, or a writer that found the ring covered with held records
		// sleeps until wait_timeout once they are all released.
		c.unlist(c.passed[seq])
		delete(c.passed, seq)
		c.mu.Unlock()
		c.wake.ifSleeping(c.r.writer, wakeWriters)
		return
	}
	e := c.held.at(int(seq - c.heldBase))
	e.released = true
	c.unlist(e.listed)
	e.listed = 0
	moved := c.passLocked()
	c.mu.Unlock()
	if moved {
		c.wake.ifSleeping(c.r.writer, wakeWriters)
	}
}

// islandize lists the records whose frames are lent out in the held table,
// as far as it has room, and moves the tail past them: called when the
// writer waits for space, so that a frame held long (a slow handler
// reading its request in place) costs the writer a record's space, not the
// whole ring. It reports whether the tail moved.
func (c *consumer) islandize() bool {
	c.mu.Lock()
	for i := 0; i < c.held.n && len(c.free) > 0; i++ {
		e := c.held.at(i)
		if e.released || e.listed != 0 {
			continue
		}
		k := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		// Listed before the tail moves past it: see producer.loadTail.
		c.r.held[k][0].Store(e.start)
		c.r.held[k][1].Store(e.end)
		c.r.nheld.Add(1)
		e.listed = k + 1
	}
	moved := c.passLocked()
	c.mu.Unlock()
	if moved {
		c.wake.ifSleeping(c.r.writer, wakeWriters)
	}
	return moved
}

// unlist frees entry listed-1 of the held table (none if listed is 0).
func (c *consumer) unlist(listed int) {
	if listed == 0 {
		return
	}
	k := listed - 1
	c.r.held[k][1].Store(0)
	c.r.held[k][0].Store(0)
	c.r.nheld.Add(^uint32(0))
	c.free = append(c.free, k)
}

// passLocked moves the tail past every leading record that is released or
// listed, and reports whether it moved; c.mu is held.
func (c *consumer) passLocked() bool {
	n := 0
	for ; n < c.held.n; n++ {
		e := c.held.at(n)
		if !e.released && e.listed == 0 {
			break
		}
		if !e.released {
			c.passed[c.heldBase+uint64(n)] = e.listed
		}
	}
	if n == 0 {
		return false
	}
	c.advanceLocked(c.held.at(n - 1).end)
	c.held.dropFront(n)
	c.heldBase += uint64(n)
	return true
}

// advanceLocked moves the tail the writer may reuse up to; c.mu is held.
func (c *consumer) advanceLocked(end uint64) {
	c.tail = end
	c.r.tail.Store(end)
}

// maxFreeFrames bounds the frames a connection keeps for reuse.
const maxFreeFrames = 256

func (c *consumer) getFrame(owner *conn) *ringFrame {
	if rf, ok := c.frames.Get(); ok {
		return rf
	}
	return &ringFrame{c: owner}
}

func (c *consumer) putFrame(rf *ringFrame) {
	rf.f.Reset()
	rf.buf = nil
	c.frames.Put(rf)
}
