package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A segment is the shared memory of one client: a header page, then for
// each direction a control page and the ring's data. docs/protocol.md
// describes it byte by byte.
//
//	0          header: magic, version, ring size, offsets, pids
//	pageSize   ring 0 control (client → server: requests)
//	2*pageSize ring 0 data, ringSize bytes
//	...        ring 1 control, ring 1 data (server → client: answers)
//
// Each control page holds four words, each on a cache line of its own so
// that the writer's and the reader's stores never share a line, then the
// table of records the reader holds and the writer must skip:
//
//	0    head   bytes the writer has published, ever (uint64)
//	64   tail   bytes the reader has released, ever (uint64)
//	128  reader sleep word: 1 while the reader sleeps or is about to, 2 while it naps
//	192  writer sleep word: 1 while a writer waits for space
//	256  held count: entries in use in the table below (uint32)
//	320  held table: 64 entries of {start, end uint64}, the positions of a
//	     record whose frame is still lent out although the tail passed it;
//	     end 0 marks a free entry
const (
	pageSize      = 4096
	cacheLine     = 64
	headOff       = 0
	tailOff       = cacheLine
	readerWordOff = 2 * cacheLine
	writerWordOff = 3 * cacheLine
	heldCountOff  = 4 * cacheLine
	heldTableOff  = 5 * cacheLine
	maxHeld       = 64

	segmentMagic   = "KRPCSHM1"
	segmentVersion = 2 // version 1 woke its peer with futexes, on which a version 2 peer never waits
	memfdName      = "kernrpc-shm-ring"
)

// segmentSize is the size of a segment whose rings are ringSize each.
func segmentSize(ringSize int) int { return 3*pageSize + 2*ringSize }

// ringOffset is where direction dir's control page starts.
func ringOffset(dir, ringSize int) int { return pageSize + dir*(pageSize+ringSize) }

// Directions, by who writes.
const (
	clientToServer = 0
	serverToClient = 1
)

// segment is a mapped segment. The mapping lives until the last of its
// users lets go (see conn.refs): a payload lent to a handler must stay
// readable even after the connection died.
type segment struct {
	mem      []byte
	ringSize int
}

// createSegment makes a fresh segment in a memfd: it has no name anywhere
// (nothing in /dev/shm), is sealed against shrinking (a peer that could
// truncate it would crash us with SIGBUS), and is freed by the system when
// both sides have unmapped it and the descriptor is closed. The caller
// passes fd to the client and closes it.
func createSegment(ringSize int, serverPID, clientPID int32) (seg *segment, fd int, err error) {
	fd, err = unix.MemfdCreate(memfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	size := segmentSize(ringSize)
	fail := func(what string, err error) (*segment, int, error) {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("%s of a %d-byte segment: %w", what, size, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("sealing", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	h := mem[:pageSize]
	copy(h, segmentMagic)
	ne := binary.NativeEndian
	ne.PutUint32(h[8:], segmentVersion)
	ne.PutUint32(h[12:], pageSize)
	ne.PutUint64(h[16:], uint64(ringSize))
	ne.PutUint64(h[24:], uint64(ringOffset(clientToServer, ringSize)))
	ne.PutUint64(h[32:], uint64(ringOffset(serverToClient, ringSize)))
	ne.PutUint32(h[40:], uint32(serverPID))
	ne.PutUint32(h[44:], uint32(clientPID))
	return &segment{mem: mem, ringSize: ringSize}, fd, nil
}

// mapSegment maps a segment received from a server. Nothing in it is
// trusted beyond what is checked here: the file must be exactly as large as
// the agreed ring size needs and sealed against shrinking (checked first,
// so that the size cannot change after it is read), and its header must
// say so too.
func mapSegment(fd, ringSize int) (*segment, error) {
	size := segmentSize(ringSize)
	// The seals first: until the file is sealed against shrinking, the
	// server could truncate it after its size was checked.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, errors.New("the segment is not sealed against shrinking; the server could crash this process by truncating it")
	}
	betweenChecks(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat of the segment: %w", err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("the segment has %d bytes, want %d for rings of %d", st.Size, size, ringSize)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap of a %d-byte segment: %w", size, err)
	}
	ne := binary.NativeEndian
	if string(mem[:8]) != segmentMagic || ne.Uint32(mem[8:]) != segmentVersion || ne.Uint64(mem[16:]) != uint64(ringSize) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("the segment header does not describe version %d rings of %d bytes", segmentVersion, ringSize)
	}
	return &segment{mem: mem, ringSize: ringSize}, nil
}

// betweenChecks runs between mapSegment's two checks of the file; tests
// make the server act there.
var betweenChecks = func(fd int) {}

func (s *segment) unmap() { unix.Munmap(s.mem) }

// ring returns direction dir's view.
func (s *segment) ring(dir int) ringView {
	off := ringOffset(dir, s.ringSize)
	ctl := s.mem[off : off+pageSize]
	return ringView{
		head:   (*atomic.Uint64)(unsafe.Pointer(&ctl[headOff])),
		tail:   (*atomic.Uint64)(unsafe.Pointer(&ctl[tailOff])),
		reader: (*atomic.Uint32)(unsafe.Pointer(&ctl[readerWordOff])),
		writer: (*atomic.Uint32)(unsafe.Pointer(&ctl[writerWordOff])),
		nheld:  (*atomic.Uint32)(unsafe.Pointer(&ctl[heldCountOff])),
		held:   (*[maxHeld][2]atomic.Uint64)(unsafe.Pointer(&ctl[heldTableOff])),
		data:   s.mem[off+pageSize : off+pageSize+s.ringSize : off+pageSize+s.ringSize],
	}
}

// ringView is one direction of a segment. head and tail only grow; a
// position's offset in data is position % len(data).
type ringView struct {
	head, tail     *atomic.Uint64
	reader, writer *atomic.Uint32 // sleep words (wake_linux.go)
	nheld          *atomic.Uint32
	held           *[maxHeld][2]atomic.Uint64 // {start, end}
	data           []byte
}
