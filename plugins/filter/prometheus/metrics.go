package prometheus

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/kernrpc/kernrpc/kernel"
)

// otherMethod labels the calls of methods past max_methods.
const otherMethod = "_other"

// numCodes is the number of status codes counted apart; a code past them
// (from a newer peer) counts as Unknown, as gRPC does.
const numCodes = int(kernel.Unauthenticated) + 1

// A method's figures on one side are integer counters in a few shards,
// each on cache lines of its own: a call adds to one shard, picked at
// random, so that calls of one method on different cores rarely write
// the same line; a scrape adds the shards up (collect.go). These are the
// counters of a shard, by index; the histogram's buckets follow.
const (
	cStarted   = iota              // calls that entered Invoke; in flight = started - ended
	cReqBytes                      // CallInfo.RequestSize, summed
	cRespBytes                     // CallInfo.ResponseSize, summed
	cAttempts                      // client: attempts (call stage: CallInfo.Attempt; attempt stage: 1 each)
	cSumNanos                      // the durations observed, in ns
	cCodes                         // numCodes counters: calls by code
	cBuckets   = cCodes + numCodes // len(bounds)+1 counters, not cumulative: calls with duration in (bound[i-1], bound[i]], the last above every bound
)

// cacheLine is the padding unit of a shard, in uint64s: 128 bytes, two
// lines, since x86's adjacent-line prefetcher pulls lines in pairs.
const cacheLine = 16

// maxShards bounds a method's shards: each costs a few hundred bytes per
// method and side, and past a few, two cores rarely pick one anyway.
const maxShards = 16

// shape is the layout of every method's counters on one side.
type shape struct {
	bounds []int64   // the buckets' upper bounds, in ns
	secs   []float64 // the same, in seconds, for the scrape
	stride int       // uint64s per shard, a multiple of cacheLine
	mask   uint32    // shards - 1; shards is a power of two
	native *prom.HistogramVec
}

func newShape(bounds []float64, native *prom.HistogramVec) *shape {
	s := &shape{secs: bounds, native: native}
	for _, b := range bounds {
		s.bounds = append(s.bounds, int64(b*1e9+0.5))
	}
	s.stride = strideOf(cBuckets + len(bounds) + 1)
	s.mask = shardMask()
	return s
}

// strideOf is the uint64s a shard of n counters takes: whole cache lines.
func strideOf(n int) int { return (n + cacheLine - 1) / cacheLine * cacheLine }

// shardMask is shards - 1 for the number of shards a method's counters
// get: about four per core, so that with calls on every core at once the
// chance that two pick one shard at the same time is about 1/4 per other
// busy core; a power of two.
func shardMask() uint32 {
	shards := 1
	for shards < 4*runtime.NumCPU() && shards < maxShards {
		shards *= 2
	}
	return uint32(shards - 1)
}

// alignedCells allocates shards × stride counters, the first shard on a
// cache line boundary whatever the allocation's alignment (one spare line
// in front makes room), so that no two shards share a line.
func alignedCells(shards, stride int) []atomic.Uint64 {
	all := make([]atomic.Uint64, shards*stride+cacheLine)
	off := 0
	for uintptr(unsafe.Pointer(&all[off]))&(cacheLine*8-1) != 0 {
		off++
	}
	return all[off : off+shards*stride]
}

// bucket is the index of the bucket counting a call of duration ns:
// the first bound ns does not exceed (le is inclusive, as client_golang
// has it), or len(bounds) past all of them.
func (s *shape) bucket(ns int64) int {
	b := s.bounds
	if len(b) <= 32 {
		// Fast calls stop at the first bounds: a scan beats a binary
		// search's unpredictable branches there.
		for i, v := range b {
			if ns <= v {
				return i
			}
		}
		return len(b)
	}
	lo, hi := 0, len(b)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if b[mid] < ns {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// methodMetrics are one method's figures on one side.
type methodMetrics struct {
	service, method string
	created         time.Time // the counters' start, for a scraper's created timestamps
	shape           *shape
	cells           []atomic.Uint64 // shards × stride, 128-byte aligned per shard
	native          prom.Observer   // native_histograms: the library's histogram, nil otherwise
}

func newMethodMetrics(s *shape, service, method string) *methodMetrics {
	m := &methodMetrics{service: service, method: method, created: time.Now(), shape: s}
	m.cells = alignedCells(int(s.mask)+1, s.stride)
	if s.native != nil {
		m.native = s.native.WithLabelValues(service, method)
	}
	return m
}

// shard is the counters of one shard, picked at random: math/rand/v2's
// top-level functions read a generator of the thread's own, without a
// lock, in a few ns.
func (m *methodMetrics) shard() []atomic.Uint64 {
	i := int(rand.Uint32()&m.shape.mask) * m.shape.stride
	return m.cells[i : i+m.shape.stride : i+m.shape.stride]
}

// ended counts a call that went through Invoke: its duration and request
// size, and on the client its code. The server counts the code in
// CallEnded, where it is the code the answer went with: a handler's
// answer that fails to encode goes out as Internal.
func (m *methodMetrics) ended(sh []atomic.Uint64, d time.Duration, side kernel.Side, code kernel.Code, reqSize int) {
	if m.native != nil {
		// The library's histogram has the duration; the first bucket
		// only counts the call as ended, for the calls in flight.
		m.native.Observe(d.Seconds())
		sh[cBuckets].Add(1)
	} else {
		ns := max(int64(d), 0)
		sh[cBuckets+m.shape.bucket(ns)].Add(1)
		sh[cSumNanos].Add(uint64(ns))
	}
	if side == kernel.ClientSide {
		sh[cCodes+codeIndex(code)].Add(1)
	}
	if reqSize > 0 {
		sh[cReqBytes].Add(uint64(reqSize))
	}
}

func codeIndex(c kernel.Code) int {
	if int(c) >= numCodes {
		return int(kernel.Unknown)
	}
	return int(c)
}

// methodTable maps one side's method names to their metrics M (a call
// method's, methodMetrics, or a streaming method's, streamMetrics).
// Readers load the map without a lock; a new method copies it under mu,
// which only first calls of a method take.
type methodTable[M any] struct {
	newMetrics func(service, method string) *M
	max        int
	byKey      atomic.Pointer[map[string]*M]
	full       atomic.Bool // max reached: unknown methods go to other, lock-free
	other      atomic.Pointer[M]
	mu         sync.Mutex
	order      []*M // every series' metrics, for the scrape; under mu
	// byLabels finds the metrics of a service and method label pair:
	// names that differ but split into the same labels ("pkg.Echo.Say"
	// and "/pkg.Echo/Say", invalid bytes that both read as U+FFFD) share
	// one series, since two with the same labels fail the scrape. Under mu.
	byLabels map[[2]string]*M
}

func (t *methodTable[M]) init(newMetrics func(service, method string) *M, max int) {
	t.newMetrics, t.max = newMetrics, max
	t.byLabels = map[[2]string]*M{}
	empty := map[string]*M{}
	t.byKey.Store(&empty)
}

// get returns the metrics of a method, resolving them on its first call.
func (t *methodTable[M]) get(method string) *M {
	if m := (*t.byKey.Load())[method]; m != nil {
		return m
	}
	if t.full.Load() {
		return t.other.Load()
	}
	return t.add(method)
}

func (t *methodTable[M]) add(method string) *M {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.byKey.Load()
	if m := old[method]; m != nil {
		return m
	}
	if len(old) >= t.max {
		if t.other.Load() == nil {
			t.other.Store(t.series(otherMethod, otherMethod))
		}
		t.full.Store(true)
		return t.other.Load()
	}
	m := t.series(splitMethod(method))
	next := make(map[string]*M, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[strings.Clone(method)] = m // the caller's string may be a connection's interned name
	t.byKey.Store(&next)
	return m
}

// series returns the metrics of the service and method labels, making
// them if no name had these labels yet; t.mu is held.
func (t *methodTable[M]) series(service, method string) *M {
	k := [2]string{service, method}
	if m := t.byLabels[k]; m != nil {
		return m
	}
	m := t.newMetrics(service, method)
	t.byLabels[k] = m
	t.order = append(t.order, m)
	return m
}

// all is every method's metrics, for a scrape.
func (t *methodTable[M]) all() []*M {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*M(nil), t.order...)
}

// splitMethod splits a method name into the service and method labels:
// "Echo.Say" into Echo and Say, gRPC's "/pkg.Echo/Say" into pkg.Echo and
// Say; a name without a separator is all method. Label values must be
// UTF-8: invalid bytes become U+FFFD.
func splitMethod(full string) (service, method string) {
	full = strings.ToValidUTF8(full, "\uFFFD")
	if rest, ok := strings.CutPrefix(full, "/"); ok {
		if s, m, ok := strings.Cut(rest, "/"); ok {
			return s, m
		}
		return "", rest
	}
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "", full
}

// Invoke measures the call around next.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	side := info.Side
	if side != kernel.ClientSide && side != kernel.ServerSide {
		return next(ctx, info, req)
	}
	m := f.calls.sides[side].get(info.Method)
	sh := m.shard()
	// In the call stage an attempt has no number before next; in the
	// attempt stage it has, and attempts are what is counted.
	attemptStage := info.Attempt > 0
	sh[cStarted].Add(1)
	// Two monotonic readings: time.Since costs one clock read, time.Now
	// two (the wall clock too), and the wall clock is no use here.
	start := time.Since(f.epoch)
	// A next that panics (the server turns a handler's panic into
	// Internal above the chain) still ends the call here, or it would
	// stay in flight for ever. An open-coded defer: about a ns.
	returned := false
	defer func() {
		if !returned {
			m.ended(sh, time.Since(f.epoch)-start, side, kernel.Internal, info.RequestSize)
		}
	}()
	resp, err := next(ctx, info, req)
	returned = true
	m.ended(sh, time.Since(f.epoch)-start, side, codeOf(err), info.RequestSize)
	if side == kernel.ClientSide {
		if info.ResponseSize > 0 {
			sh[cRespBytes].Add(uint64(info.ResponseSize))
		}
		if attemptStage {
			sh[cAttempts].Add(1)
		} else if info.Attempt > 0 {
			sh[cAttempts].Add(uint64(info.Attempt))
		}
	}
	return resp, err
}

// CallEnded is the server's word that a call of a served method was
// answered (kernel.CallObserver): it counts every call by the code it was
// answered with, and its response's size. The calls no filter's Invoke
// saw (handled is false: refused by an Admitter, or their request did not
// decode) are counted with their request's size too, which Invoke counted
// for the others. Such calls have no duration: the histogram counts
// handled calls only.
func (f *Filter) CallEnded(info *kernel.CallInfo, err error, handled bool) {
	sh := f.calls.sides[kernel.ServerSide].get(info.Method).shard()
	sh[cCodes+codeIndex(codeOf(err))].Add(1)
	if info.ResponseSize > 0 {
		sh[cRespBytes].Add(uint64(info.ResponseSize))
	}
	if !handled && info.RequestSize > 0 {
		sh[cReqBytes].Add(uint64(info.RequestSize))
	}
}

// codeOf is kernel.CodeOf without its allocation for the errors calls
// usually end with: a *kernel.Status or a context error as such.
func codeOf(err error) kernel.Code {
	switch err {
	case nil:
		return kernel.OK
	case context.Canceled:
		return kernel.Canceled
	case context.DeadlineExceeded:
		return kernel.DeadlineExceeded
	}
	if s, ok := err.(*kernel.Status); ok && s != nil && s.Code != kernel.OK {
		return s.Code
	}
	return kernel.CodeOf(err) // an error claiming OK, or a nil *Status, reads Unknown
}
