package kernrpc

import (
	"log/slog"
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Why kernrpc keeps GC headroom (config key gc_headroom, default
// DefaultGCHeadroom): Go's collector starts a cycle once the heap has grown
// by GOGC percent over what the last cycle found live, but never below
// 4 MiB. A service whose live heap is a few MiB and which decodes large
// messages, each bytes field into a fresh slice as protobuf-go decodes,
// therefore collects hundreds of times a second: at 64 KiB a call, every
// process collects every 40-odd calls, and the collector, the scavenger
// handing freed pages back to the kernel and the page faults taking them
// again cost more CPU than the call (docs/performance.md, "GC headroom").
//
// The headroom is a pointer-free allocation the process keeps reachable
// and never writes. It counts as live heap, so the heap goal rises by
// twice its size (the headroom itself and as much again) and about its
// size more garbage grows between cycles; the collector has nothing to
// scan in it; and memory fresh from the kernel is zero already, so its
// pages are not made resident unless the runtime hands it memory it used
// before (then up to its size of resident memory).
//
// A program that sets GOGC or GOMEMLIMIT (in the environment or through
// runtime/debug) has chosen its own collector settings: kernrpc then takes
// no headroom. In a container, the headroom is at most a sixteenth of its
// memory limit, which the garbage it lets grow must not approach.

// DefaultGCHeadroom is gc_headroom's default: 64 MiB. At 64 KiB a call,
// 16 MiB still left each process collecting 70-80 times a second, and
// 64 MiB took 4 and 64 callers 15-40% further for about 50 MB more
// resident memory per process (docs/performance.md, "GC headroom").
const DefaultGCHeadroom = 64 << 20

// maxGCHeadroom bounds gc_headroom.
const maxGCHeadroom = 1 << 30

// largeFrame is the payload size from which a frame counts as large: the
// size from which Go allocates each object on pages of its own.
const largeFrame = 32 << 10

// headroomLinger is how long the process keeps its headroom once the last
// Server or Client holding it has closed: a program that makes a client
// per call would otherwise allocate it anew, and cleared, each time. A
// variable so that a test can shorten it.
var headroomLinger = 30 * time.Second

// gcHeadroom is the process's headroom, held for as long as any open Server
// or Client that has read a large frame holds it. It is the one piece of
// process-wide state in the engine outside the plugin table: the collector
// it serves is the process's, and one reservation per Server or Client
// would multiply it.
type gcHeadroom struct {
	mu      sync.Mutex
	holders int
	mem     []byte
	drop    *time.Timer
	dropGen uint64 // tells the last release's drop timer from earlier ones
}

var processHeadroom gcHeadroom

// acquire adds a holder and grows the headroom to size, or to a
// sixteenth of the process's container memory limit if that is less,
// reporting false (holding nothing) when the program set its own collector
// settings.
func (h *gcHeadroom) acquire(size int) bool {
	if gcTunedByProgram() {
		return false
	}
	size = headroomWithin(size)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holders++
	if h.drop != nil {
		h.drop.Stop() // one that fired already finds a holder and keeps it
		h.drop = nil
	}
	if len(h.mem) < size {
		h.mem = make([]byte, size)
	}
	return true
}

// release drops a holder; the last one leaves the headroom to be dropped
// after headroomLinger, unless a holder comes back first.
func (h *gcHeadroom) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holders--
	if h.holders > 0 {
		return
	}
	h.dropGen++
	gen := h.dropGen
	h.drop = time.AfterFunc(headroomLinger, func() { h.dropIf(gen) })
}

func (h *gcHeadroom) dropIf(gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dropGen == gen && h.holders == 0 {
		h.mem, h.drop = nil, nil
	}
}

// size is how much headroom the process holds now.
func (h *gcHeadroom) size() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mem)
}

// headroomWithin is size, or a sixteenth of the memory limit of the
// process's container (cgroup) if that is less: in a small container, the
// headroom's garbage must not take the process near its limit.
func headroomWithin(size int) int {
	if limit, ok := containerLimit(); ok && int64(size) > limit/16 {
		return int(limit / 16)
	}
	return size
}

// containerLimit reads the container's memory limit once a process: a
// program that makes a client per call must not read /proc each time.
var containerLimit = sync.OnceValues(memoryLimit)

// gcTunedByProgram reports whether GOGC or the memory limit differ from
// the runtime's defaults, as set by the environment or by runtime/debug.
func gcTunedByProgram() bool {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return true // a runtime that cannot say: leave its collector alone
	}
	return s[0].Value.Uint64() != 100 || s[1].Value.Uint64() != math.MaxInt64
}

// headroomHold is one Server's or Client's part in the process's headroom:
// taken at the first large frame it reads (a service of small messages
// never takes it), given back when it closes.
type headroomHold struct {
	size  int // gc_headroom; 0 takes none
	log   func() *slog.Logger
	tried atomic.Bool // set once taken, refused, or closed: the read path's one check
	mu    sync.Mutex
	held  bool
}

// noteFrame is called with the payload size of every frame read.
func (h *headroomHold) noteFrame(payload int) {
	if payload >= largeFrame && !h.tried.Load() {
		h.take()
	}
}

func (h *headroomHold) take() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tried.Swap(true) || h.size <= 0 {
		return
	}
	h.held = processHeadroom.acquire(h.size)
	if h.held {
		h.log().Debug("large messages: keeping GC headroom while open (gc_headroom)", "bytes", processHeadroom.size())
	} else {
		h.log().Debug("large messages: no GC headroom taken, as GOGC or GOMEMLIMIT is set")
	}
}

// bytes is the process's headroom while this hold has it, else 0: what the
// engine reports (server_gc_headroom_bytes, client_gc_headroom_bytes).
func (h *headroomHold) bytes() int {
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	if !held {
		return 0
	}
	return processHeadroom.size()
}

// release gives the hold back, once; after it the hold takes nothing.
func (h *headroomHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tried.Store(true)
	if h.held {
		h.held = false
		processHeadroom.release()
	}
}
