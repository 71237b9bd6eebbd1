package kernrpc

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// This file keeps the status console's figures of the calls a server
// serves. Recording a call costs two monotonic clock reads, a map lookup by pointer
// and a few atomic adds on the method's own counters: no lock shared by
// all calls and no allocation. Only a call slower than the slowest calls
// kept so far takes a lock, and that grows rare as the list fills.

// windowCounter is a count that belongs to one epoch (a second, a few
// seconds): its high bits hold the epoch it counts for, so the first add
// of a new epoch restarts it from 1 in the same compare-and-swap, and a
// reader tells a stale count from a current one without a lock.
type windowCounter struct{ w atomic.Uint64 }

const (
	epochBits = 24 // wraps after 194 days of seconds, far beyond any window
	countBits = 64 - epochBits
	countMask = 1<<countBits - 1
	epochMask = 1<<epochBits - 1
)

func (c *windowCounter) add(epoch int64) {
	e := uint64(epoch) & epochMask
	for {
		w := c.w.Load()
		n := e<<countBits | 1
		if w>>countBits == e {
			n = w + 1
		}
		if c.w.CompareAndSwap(w, n) {
			return
		}
	}
}

// in returns the count if it is epoch's, else 0.
func (c *windowCounter) in(epoch int64) uint64 {
	w := c.w.Load()
	if w>>countBits != uint64(epoch)&epochMask {
		return 0
	}
	return w & countMask
}

const (
	// rateWindow is the span over which QPS and the error rate are
	// averaged: the last rateWindow whole seconds.
	rateWindow = 10
	// secondSlots is the ring of per-second counters: the window and the
	// second being counted, with room for a reader that runs late.
	secondSlots = 16
	// histSpan is how many seconds one latency histogram counts; the
	// percentiles are over histWindow of them (the current, partial one
	// included), about the last 8 to 10 seconds.
	histSpan   = 2
	histWindow = 5
	histSlots  = histWindow + 1
)

// Latency buckets are log-scale: four per power of two, from 256 ns up
// (about 19% wide, so a percentile read from them is within about 12%
// of the true value), the last one catching everything over 2 hours: a
// long poll's minutes are told apart too.
const (
	latencyUnitShift = 8 // 256 ns
	latencySubBits   = 2
	latencyBuckets   = 136
)

// latencyBucket is the bucket a duration falls in.
func latencyBucket(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	v := uint64(d) >> latencyUnitShift
	if v < 1<<latencySubBits {
		return int(v)
	}
	shift := bits.Len64(v) - latencySubBits - 1
	i := shift<<latencySubBits + int(v>>shift)
	return min(i, latencyBuckets-1)
}

// latencyBounds is the range of durations bucket i holds, [lo, hi).
func latencyBounds(i int) (lo, hi time.Duration) {
	if i < 1<<latencySubBits {
		return time.Duration(i) << latencyUnitShift, time.Duration(i+1) << latencyUnitShift
	}
	shift := i>>latencySubBits - 1
	top := uint64(i&(1<<latencySubBits-1) | 1<<latencySubBits)
	return time.Duration(top<<shift) << latencyUnitShift, time.Duration((top+1)<<shift) << latencyUnitShift
}

// methodStats is one method's figures.
type methodStats struct {
	name    string
	byCode  [int(kernel.Unauthenticated) + 2]atomic.Int64 // since start; the last counts codes beyond the known ones
	calls   [secondSlots]windowCounter
	errs    [secondSlots]windowCounter
	latency [histSlots][latencyBuckets]windowCounter
}

func (m *methodStats) record(code kernel.Code, d time.Duration, now int64) {
	m.count(code, now)
	span := now / histSpan
	m.latency[span%histSlots][latencyBucket(d)].add(span)
}

// count counts one call ending with code in second now, in the counts
// and rates but not in the latency figures.
func (m *methodStats) count(code kernel.Code, now int64) {
	m.byCode[min(int(code), len(m.byCode)-1)].Add(1)
	m.calls[now%secondSlots].add(now)
	if code != kernel.OK {
		m.errs[now%secondSlots].add(now)
	}
}

// methodView is what the console shows of one method.
type methodView struct {
	Service     string           `json:"service"`
	Method      string           `json:"method"`
	Calls       int64            `json:"calls"`
	Errors      int64            `json:"errors"`
	Codes       map[string]int64 `json:"codes"`
	QPS         float64          `json:"qps"`
	ErrorRate   float64          `json:"error_rate"`
	P50Millis   float64          `json:"p50_ms"`
	P99Millis   float64          `json:"p99_ms"`
	WindowCalls uint64           `json:"window_calls"`
}

// view reads m as of now (a Unix second); windowSecs is how many whole
// seconds the rate window spans so far (less than rateWindow just after
// the start).
func (m *methodStats) view(now int64, windowSecs int64) methodView {
	v := methodView{Service: methodService(m.name), Method: m.name, Codes: map[string]int64{}}
	for c := range m.byCode {
		n := m.byCode[c].Load()
		if n == 0 {
			continue
		}
		name := kernel.Code(c).String()
		if c == len(m.byCode)-1 {
			name = "other"
		}
		v.Codes[name] = n
		v.Calls += n
		if kernel.Code(c) != kernel.OK {
			v.Errors += n
		}
	}
	var calls, errs uint64
	for s := now - windowSecs; s < now; s++ {
		calls += m.calls[s%secondSlots].in(s)
		errs += m.errs[s%secondSlots].in(s)
	}
	v.WindowCalls = calls
	v.QPS = float64(calls) / float64(windowSecs)
	if calls > 0 {
		v.ErrorRate = float64(errs) / float64(calls)
	}
	var hist [latencyBuckets]uint64
	span := now / histSpan
	for s := span - histWindow + 1; s <= span; s++ {
		for i := range hist {
			hist[i] += m.latency[s%histSlots][i].in(s)
		}
	}
	v.P50Millis = millis(percentile(&hist, 0.50))
	v.P99Millis = millis(percentile(&hist, 0.99))
	return v
}

// methodService is the service a method name is grouped under: the name
// up to its last dot, or "".
func methodService(name string) string {
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		return name[:i]
	}
	return ""
}

// percentile is the duration below which fraction q of the counted calls
// fell, as the middle of the bucket it lands in; 0 with no calls.
func percentile(hist *[latencyBuckets]uint64, q float64) time.Duration {
	var total uint64
	for _, n := range hist {
		total += n
	}
	if total == 0 {
		return 0
	}
	// Nearest rank: the smallest call with at least q of them at or below it.
	rank := max(1, uint64(math.Ceil(q*float64(total)-1e-9)))
	var seen uint64
	for i, n := range hist {
		seen += n
		if seen >= rank {
			lo, hi := latencyBounds(i)
			return lo + (hi-lo)/2
		}
	}
	return 0
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// slowCall is one of the slowest recent calls.
type slowCall struct {
	At       time.Time
	Method   string
	Duration time.Duration
	Code     kernel.Code
	Peer     string
	TraceID  string
}

// maxSlowMethodName bounds the name of a method not served here that the
// slowest calls keep: the client chose it, and a frame may carry
// megabytes of it.
const maxSlowMethodName = 256

const (
	slowestKept = 20
	// The slowest calls are kept per slowSpan seconds, in slowSlots
	// slots, so that a call leaves the list about slowAge after it ended.
	slowSpan  = 10
	slowSlots = 7
	slowAge   = time.Minute
)

// slowSlot keeps the slowestKept slowest calls of one slowSpan. floor is
// the quickest of them once it is full (in nanoseconds, with the slot's
// span in the high bits, as windowCounter keeps it): a call no slower
// costs one atomic load.
type slowSlot struct {
	floor atomic.Uint64
	mu    sync.Mutex
	span  int64
	calls []slowCall
}

// slowest is the server's list of its slowest recent calls.
type slowest struct{ slots [slowSlots]slowSlot }

// worth reports, without a lock, whether a call of d ending in second
// now may enter the list.
func (s *slowest) worth(d time.Duration, now int64) bool {
	span := now / slowSpan
	f := s.slots[span%slowSlots].floor.Load()
	return f>>countBits != uint64(span)&epochMask || time.Duration(f&countMask) < d
}

func (s *slowest) add(c slowCall, now int64) {
	span := now / slowSpan
	sl := &s.slots[span%slowSlots]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.span != span {
		sl.span, sl.calls = span, sl.calls[:0]
	}
	if len(sl.calls) == slowestKept {
		if sl.calls[len(sl.calls)-1].Duration >= c.Duration {
			return
		}
		sl.calls = sl.calls[:len(sl.calls)-1]
	}
	i, _ := slices.BinarySearchFunc(sl.calls, c.Duration, func(e slowCall, d time.Duration) int { return cmp.Compare(d, e.Duration) })
	sl.calls = slices.Insert(sl.calls, i, c)
	floor := (uint64(span) & epochMask) << countBits
	if len(sl.calls) == slowestKept {
		floor |= min(uint64(sl.calls[len(sl.calls)-1].Duration), countMask)
	}
	sl.floor.Store(floor)
}

// list returns the slowestKept slowest calls that ended since now-slowAge,
// slowest first.
func (s *slowest) list(now time.Time) []slowCall {
	var out []slowCall
	since := now.Add(-slowAge)
	for i := range s.slots {
		sl := &s.slots[i]
		sl.mu.Lock()
		for _, c := range sl.calls {
			if c.At.After(since) {
				out = append(out, c)
			}
		}
		sl.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b slowCall) int { return cmp.Compare(b.Duration, a.Duration) })
	return out[:min(len(out), slowestKept)]
}

// serverStats is every method's figures and the slowest calls. Its maps
// are built at Start, once every method is registered, and only read
// afterwards.
type serverStats struct {
	started time.Time
	// The clock calls are counted on: the wall clock at the start plus the
	// monotonic time since epoch, so that a call's second is worked out
	// from one monotonic reading (time.Since of a time with a monotonic
	// reading costs one clock read, time.Now two) and readers agree.
	epoch         time.Time
	startUnixNano int64
	byDesc        map[*methodDesc]*methodStats
	other         *methodStats // calls of methods not served here
	sorted        []*methodStats
	slow          slowest
}

// otherMethods names the figures of calls of methods the server does not
// serve, kept together so that made-up names cost no memory.
const otherMethods = "(not served here)"

func (st *serverStats) init(methods map[string]*methodDesc, now time.Time) {
	st.started, st.byDesc, st.other = now, make(map[*methodDesc]*methodStats, len(methods)), &methodStats{name: otherMethods}
	st.epoch, st.startUnixNano = now, now.UnixNano()
	for name, d := range methods {
		m := &methodStats{name: name}
		st.byDesc[d] = m
		st.sorted = append(st.sorted, m)
	}
	// By service, then name: the page draws each service under one
	// heading, and Svc.Sub.X must not come between Svc.A and Svc.Z.
	// Methods of no service come last, where the calls of methods not
	// served here (of no service either) join them.
	slices.SortFunc(st.sorted, func(a, b *methodStats) int {
		sa, sb := methodService(a.name), methodService(b.name)
		if (sa == "") != (sb == "") {
			return cmp.Compare(len(sb), len(sa)) // "" last
		}
		return cmp.Or(cmp.Compare(sa, sb), cmp.Compare(a.name, b.name))
	})
	for i := range st.slow.slots {
		// Full size from the start: keeping a call never allocates.
		st.slow.slots[i].calls = make([]slowCall, 0, slowestKept)
	}
}

// mono is the monotonic time since the stats began, in ns.
func (st *serverStats) mono() int64 { return int64(time.Since(st.epoch)) }

// clock is the time now on the stats' clock.
func (st *serverStats) clock() time.Time {
	return time.Unix(0, st.startUnixNano+st.mono())
}

// record counts one served call that began at start (a mono). It
// runs on every call, after the answer is written.
func (st *serverStats) record(sc *serverConn, c *callCtx, start int64) {
	endMono := st.mono()
	d := time.Duration(endMono - start)
	endNano := st.startUnixNano + endMono
	now := endNano / int64(time.Second)
	m := st.byDesc[c.desc]
	if m == nil {
		m = st.other
	}
	code := c.out.Code
	m.record(code, d, now)
	if st.slow.worth(d, now) {
		name := m.name
		if m == st.other {
			name = slowMethodName(c.info.Method)
		}
		st.slow.add(slowCall{At: time.Unix(0, endNano), Method: name, Duration: d, Code: code,
			Peer: sc.conn.RemoteAddr(), TraceID: traceID(c.info.Metadata)}, now)
	}
}

// recordStream counts one stream of c's method (or one refused before it
// opened) as it ends with code: in the calls by code, QPS and error rate,
// not in the latency figures or the slowest calls, since a stream's
// lifetime is no call's latency.
func (st *serverStats) recordStream(c *callCtx, code kernel.Code) {
	now := (st.startUnixNano + st.mono()) / int64(time.Second)
	m := st.byDesc[c.desc]
	if m == nil {
		m = st.other
	}
	m.count(code, now)
}

// slowMethodName is the name the slowest calls keep of a method not
// served here: the client's, cut to maxSlowMethodName bytes where a
// character ends, in a copy of its own.
func slowMethodName(name string) string {
	if len(name) <= maxSlowMethodName {
		return name
	}
	const cut = "…"
	return strings.ToValidUTF8(name[:maxSlowMethodName-len(cut)], "") + cut
}

// traceID is the trace id of a W3C traceparent in md
// ("00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"), or "".
func traceID(md kernel.Metadata) string {
	tp := md["traceparent"]
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' {
		return ""
	}
	id := tp[3:35]
	for i := 0; i < len(id); i++ {
		if !(id[i] >= '0' && id[i] <= '9' || id[i] >= 'a' && id[i] <= 'f') {
			return ""
		}
	}
	if id == "00000000000000000000000000000000" {
		return ""
	}
	return id
}

// methods is every method's view as of now, the served ones sorted, then
// those not served here if any were called.
func (st *serverStats) methods(now time.Time) []methodView {
	sec := now.Unix()
	window := min(rateWindow, max(1, sec-st.started.Unix()))
	// Just after the start the window's first second is the one the stats
	// began in, counted only since then: the QPS is over the time counted.
	counted := float64(window)
	if sec-window == st.started.Unix() {
		counted -= float64(st.started.Nanosecond()) / float64(time.Second)
	}
	view := func(m *methodStats) methodView {
		v := m.view(sec, window)
		v.QPS = float64(v.WindowCalls) / counted
		return v
	}
	out := make([]methodView, 0, len(st.sorted)+1)
	for _, m := range st.sorted {
		out = append(out, view(m))
	}
	if v := view(st.other); v.Calls > 0 {
		out = append(out, v)
	}
	return out
}
