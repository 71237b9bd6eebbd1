package shmring

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kernrpc/kernrpc/kernel"
)

// Records. Every record starts at a position that is a multiple of 8 with
// one 8-byte word, so that a reader always finds a whole word before the
// ring's end (there is never a 1–7 byte tail to read past):
//
//	0  uint32 size   bytes of the record, this word included; a multiple of 8
//	4  uint8  kind
//	5  3 bytes zero
//
// Records with content (frames and chunks) continue with a second word:
//
//	8   uint32 start   where the content begins, from the record's start
//	12  uint32 length  content bytes
//
// A frame record's content is one kernel frame, length prefix included
// (docs/protocol.md); chunk records carry consecutive pieces of one, the
// first piece beginning with its length prefix. Integers are in the host's
// byte order (both ends share the host), except inside the kernel frame.
const (
	wordLen         = 8
	recordHeaderLen = 16
	// headroom is room left before a lent buffer for the frame header,
	// which is only known once the payload is encoded. A header that does
	// not fit (huge metadata) sends the frame by copying it instead.
	headroom = 240
	// lentPrefix is where a lent buffer starts inside its record.
	lentPrefix = recordHeaderLen + headroom
	// defaultLentCap is what Buffer lends when the caller cannot say how
	// much it will encode.
	defaultLentCap = 512
)

const (
	kindPad        = 1 // skip: a buffer lent and never sent, or given up on
	kindWrap       = 2 // the rest of the ring is unused: continue at offset 0
	kindFrame      = 3 // one whole kernel frame
	kindFirstChunk = 4 // the first piece of a frame too large for one record
	kindChunk      = 5 // a further piece of it
	kindAbort      = 6 // the chunked frame in progress will not be finished
	kindEnd        = 7 // the writer closed its side: nothing follows
)

var ne = binary.NativeEndian

func align8(n int) int { return (n + 7) &^ 7 }

// errCorrupt is wrapped by every error about the peer's side of the shared
// memory: a record or an index that no honest peer writes.
var errCorrupt = fmt.Errorf("%w: shared memory holds what no kernrpc peer writes", kernel.ErrMalformedFrame)

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errCorrupt}, args...)...)
}

// fifo is a queue on a reused ring buffer.
type fifo[T any] struct {
	buf      []T
	first, n int
}

func (q *fifo[T]) at(i int) *T { return &q.buf[(q.first+i)%len(q.buf)] }

func (q *fifo[T]) push(v T) {
	if q.n == len(q.buf) {
		grown := make([]T, max(8, 2*len(q.buf)))
		for i := range q.n {
			grown[i] = *q.at(i)
		}
		q.buf, q.first = grown, 0
	}
	q.n++
	*q.at(q.n - 1) = v
}

func (q *fifo[T]) dropFront(n int) {
	q.first, q.n = (q.first+n)%max(len(q.buf), 1), q.n-n
}

// The producer's slots are the records between the published head and the
// reservation cursor, in order. A slot is lent (a buffer from Buffer that
// its holder may still be encoding into), being written by WriteFrame,
// written and waiting for an earlier slot to be written, or filler that
// becomes a record of its own when published.
type slotState uint8

const (
	slotLent    slotState = iota // Buffer lent it; its holder may still write into it
	slotWriting                  // a writer copies a record into it now
	slotWritten                  // complete; published once nothing before it is being written
	slotDead                     // nothing in it: published as padding
	slotWrap                     // the rest of the ring: published as a wrap marker
	slotAbort                    // published as an abort record
)

type slot struct {
	pos   uint64 // ring position of the record
	size  uint32 // bytes reserved
	state slotState
	kind  uint8 // slotWritten: the record's kind
}

// island is ring space the writer must not reuse yet and skips (covers
// with padding) every time it comes round to it. Its own islands are lent
// buffers passed over while their holders still had them, kept until the
// buffer is sent (copied elsewhere) or recycled; the reader's are records
// whose frames are still lent out although its tail moved past them, kept
// until released (see consumer.islandize).
type island struct{ off, size uint64 }

// producer writes one direction. Writers reserve space under mu, write
// their record without it, then publish under mu again. Records are
// published in ring order; a lent buffer still unwritten when a later
// record is published becomes an island, so that a held buffer never
// stalls the other writers.
type producer struct {
	r         ringView
	size      uint64
	maxRecord int

	mu        sync.Mutex
	head      uint64 // published
	cursor    uint64 // reserved up to here
	tail      uint64 // the reader's last release, as validated
	heldSeen  uint32 // the reader's held count, as loaded with the tail
	rewindAt  uint64 // the cursor past which rewind looks at the tail again
	slots     fifo[slot]
	islands   []island // this side's
	peer      []island // the reader's, as read with the tail
	abortOwed bool     // a chunked frame was given up on: an abort record must precede the next record
	waiters   int      // writers waiting for space: Buffer lends nothing meanwhile, so they are not overtaken
	endSent   bool
	fill      []filler // reserve's scratch

	freed atomic.Uint64 // counts islands let go of, so that a waiter does not sleep through one
}

func newProducer(r ringView) producer {
	return producer{r: r, size: uint64(len(r.data)), maxRecord: len(r.data) / 4}
}

// loadTail reads the reader's release index, which must lie between what
// it released before and what was published, and then the records it
// holds past it. The reader lists a record before it moves the tail past
// it, so the table read after the tail has every record the tail passed
// and the writer could reach; later ones are left for the next load.
func (p *producer) loadTail() error {
	t := p.r.tail.Load()
	if t < p.tail || t > p.head {
		return corrupt("the reader's tail moved to %d, outside [%d, %d]", t, p.tail, p.head)
	}
	p.tail = t
	p.peer = p.peer[:0]
	// Loaded before the table: a writer waiting for room watches the count
	// (see conn.waitSpace), so an entry freed after this load is noticed.
	p.heldSeen = p.r.nheld.Load()
	if p.heldSeen == 0 {
		return nil
	}
	for i := range p.r.held {
		e := &p.r.held[i]
		end := e[1].Load()
		if end == 0 {
			continue
		}
		start := e[0].Load()
		if e[1].Load() != end || end > t {
			// Released and reused meanwhile, or listed and not passed yet:
			// either way, past what this tail lets the writer reach.
			continue
		}
		// Records are 8-byte aligned and never cross the ring's end: an
		// island that did would put the cursor off the 8-byte grid, where
		// a wrap marker or abort word no longer fits before the end.
		if start%8 != 0 || end%8 != 0 || start >= end || end-start > uint64(p.maxRecord) || start%p.size+(end-start) > p.size {
			return corrupt("held record [%d, %d) is not a record", start, end)
		}
		p.peer = append(p.peer, island{off: start % p.size, size: end - start})
	}
	return nil
}

// islandAt returns an island that overlaps [off, off+n), or false.
func (p *producer) islandAt(off, n uint64) (island, bool) {
	for _, list := range [2][]island{p.islands, p.peer} {
		for _, is := range list {
			if is.off < off+n && off < is.off+is.size {
				return is, true
			}
		}
	}
	return island{}, false
}

// fillers are the slots a reservation puts before its record.
type filler struct {
	size  uint64
	state slotState
}

// reserve takes between minN and maxN contiguous bytes (multiples of 8,
// maxN <= maxRecord) for a record in state st. On the way it puts an
// abort record if one is owed, a wrap marker when minN does not fit
// before the ring's end, and padding over islands. ok is false when there
// is not enough space now.
func (p *producer) reserve(minN, maxN int, st slotState) (pos uint64, n int, ok bool, err error) {
	for attempt := 0; attempt < 2; attempt++ {
		if attempt == 1 {
			if err := p.loadTail(); err != nil {
				return 0, 0, false, err
			}
		}
		rewind := attempt == 0 && p.rewind(minN)
		free := p.tail + p.size - p.cursor
		at, fill := p.cursor, p.fill[:0]
		if rewind {
			toEnd := p.size - at%p.size
			fill = append(fill, filler{toEnd, slotWrap})
			at += toEnd
		}
		if p.abortOwed {
			// An abort word always fits before the end: offsets are
			// multiples of 8.
			fill = append(fill, filler{wordLen, slotAbort})
			at += wordLen
		}
		for at-p.cursor <= free {
			off := at % p.size
			toEnd := p.size - off
			if toEnd < uint64(minN) {
				fill = append(fill, filler{toEnd, slotWrap})
				at += toEnd
				continue
			}
			is, hit := p.islandAt(off, uint64(minN))
			if !hit {
				break
			}
			skip := is.off + is.size - off
			fill = append(fill, filler{skip, slotDead})
			at += skip
		}
		p.fill = fill[:0]
		if at-p.cursor+uint64(minN) > free {
			continue
		}
		off := at % p.size
		avail := min(free-(at-p.cursor), p.size-off)
		for _, list := range [2][]island{p.islands, p.peer} {
			for _, is := range list {
				if is.off >= off {
					avail = min(avail, is.off-off)
				}
			}
		}
		n = int(min(uint64(maxN), avail))
		for _, f := range fill {
			p.slots.push(slot{pos: p.cursor, size: uint32(f.size), state: f.state})
			p.cursor += f.size
		}
		p.abortOwed = false
		pos = p.cursor
		p.slots.push(slot{pos: pos, size: uint32(n), state: st})
		p.cursor += uint64(n)
		return pos, n, true, nil
	}
	return 0, 0, false, nil
}

// hotWindow is how far into the ring the writer goes while the reader
// keeps up: past it, with every record released, the next one starts again
// at offset 0, so that the pages both sides touch stay in their caches
// instead of the whole ring streaming through them.
const hotWindow = 128 << 10

// rewindRecheck is how far the cursor moves past a failed rewind before
// the next one loads the tail. Loading it pulls over the cache line the
// reader stores to on every release: a stream of small messages, whose
// ring is never empty, paid that on every record.
const rewindRecheck = hotWindow / 8

// rewind reports whether to wrap to the ring's start now, before the end:
// the ring is empty, the cursor is past hotWindow, and the record fits
// in the space the wrap leaves.
func (p *producer) rewind(minN int) bool {
	off := p.cursor % p.size
	if off < hotWindow || off < uint64(minN) || p.slots.n > 0 || len(p.islands) > 0 || p.abortOwed || p.cursor < p.rewindAt {
		return false
	}
	if p.loadTail() == nil && p.tail == p.head && len(p.peer) == 0 {
		return true
	}
	p.rewindAt = p.cursor + rewindRecheck
	return false
}

// find returns the index of the slot at pos, or -1.
func (p *producer) find(pos uint64) int {
	// From the newest: the slot a writer finishes is usually one it just
	// reserved, while older ones wait behind a slot still being filled
	// (many writers on one connection keep hundreds in flight).
	for i := p.slots.n - 1; i >= 0; i-- {
		if p.slots.at(i).pos == pos {
			return i
		}
	}
	return -1
}

// findLent returns the lent slot whose buffer starts at ring offset off.
func (p *producer) findLent(off uint64) int {
	for i := p.slots.n - 1; i >= 0; i-- { // newest first, as find
		if s := p.slots.at(i); s.state == slotLent && (s.pos%p.size)+lentPrefix == off {
			return i
		}
	}
	return -1
}

// letGo forgets the island whose buffer starts at ring offset off and
// reports whether there was one.
func (p *producer) letGo(off uint64) bool {
	for i, is := range p.islands {
		if is.off+lentPrefix == off {
			p.islands = append(p.islands[:i], p.islands[i+1:]...)
			p.freed.Add(1)
			return true
		}
	}
	return false
}

// isIsland reports whether an island's buffer starts at ring offset off.
func (p *producer) isIsland(off uint64) bool {
	for _, is := range p.islands {
		if is.off+lentPrefix == off {
			return true
		}
	}
	return false
}

// written marks the slot at pos complete with a record of the given kind,
// giving back the unused end of the reservation if nothing follows it.
func (p *producer) written(pos uint64, used int, kind uint8) {
	i := p.find(pos)
	s := p.slots.at(i)
	if i == p.slots.n-1 && used < int(s.size) {
		p.cursor -= uint64(int(s.size) - used)
		s.size = uint32(used)
	}
	s.state, s.kind = slotWritten, kind
}

// recycle turns the lent slot at index i into padding, and gives back the
// space of the filler at the end; it reports whether it gave back any.
func (p *producer) recycle(i int) (shrunk bool) {
	p.slots.at(i).state = slotDead
	for p.slots.n > 0 {
		last := p.slots.at(p.slots.n - 1)
		if last.state != slotDead && last.state != slotWrap {
			break
		}
		p.cursor = last.pos
		p.slots.n--
		shrunk = true
	}
	return shrunk
}

// publish publishes every slot up to the last written one that no slot
// being written precedes, and reports whether head moved. Slots passed on
// the way become padding, wrap markers or abort records; lent ones become
// islands.
func (p *producer) publish() bool {
	last := -1
	for i := range p.slots.n {
		s := p.slots.at(i)
		if s.state == slotWriting {
			break
		}
		if s.state == slotWritten {
			last = i
		}
	}
	if last < 0 {
		return false
	}
	for i := 0; i <= last; i++ {
		s := p.slots.at(i)
		kind := uint8(kindPad)
		switch s.state {
		case slotWritten:
			kind = s.kind
		case slotWrap:
			kind = kindWrap
		case slotAbort:
			kind = kindAbort
		case slotLent:
			p.islands = append(p.islands, island{off: s.pos % p.size, size: uint64(s.size)})
		}
		putWord(p.r.data, s.pos%p.size, s.size, kind)
	}
	end := p.slots.at(last).pos + uint64(p.slots.at(last).size)
	p.slots.dropFront(last + 1)
	p.head = end
	p.r.head.Store(end)
	return true
}

func putWord(data []byte, off uint64, size uint32, kind uint8) {
	w := data[off : off+wordLen]
	ne.PutUint32(w, size)
	w[4], w[5], w[6], w[7] = kind, 0, 0, 0
}

// putContent writes a content record's second word.
func putContent(data []byte, off uint64, start, length int) {
	ne.PutUint32(data[off+8:], uint32(start))
	ne.PutUint32(data[off+12:], uint32(length))
}
