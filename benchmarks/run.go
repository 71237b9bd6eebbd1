package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// options is a parsed command line, minus output.
type options struct {
	duration time.Duration // measured time per round
	warmup   time.Duration // unmeasured calls before each round's window
	rounds   int
	modes    []string // modeOrder's, in its order
	payloads []int    // long mode
	callers  []int    // long mode
	// shortCallers are the short mode's concurrent callers.
	shortCallers []int
	// clients, clientCallers and manyPayloads shape the many mode: the
	// counts of client processes, one row each, callers per process, and
	// payload sizes in bytes.
	clients       []int
	clientCallers int
	manyPayloads  []int
	// streamSizes and streams shape the stream mode: message sizes, and
	// concurrent streams; streamDuration replaces duration there, since
	// a stream's rate settles at once.
	streamSizes, streams []int
	streamDuration       time.Duration
	systems              []*system
	progress             io.Writer // where progress lines go (stderr)
	// profileDir, when set, receives CPU profiles: client.pprof for this
	// process (every system's client), server-<system>.pprof per server.
	profileDir string
	// codecs asks for the codec table (see codecs.go) after the rounds.
	codecs bool
	// server configures the servers, in their child processes.
	server serveOptions
}

// cell is one point of the matrix: every system runs it, rounds interleaved.
type cell struct {
	mode    string // modeLong, modeShort, modeMany or modeStream
	payload int    // bytes (of each message in stream mode)
	callers int    // concurrent callers sharing one client (per process in many mode; streams in stream mode)
	clients int    // client processes, in many mode; 0 otherwise
}

// result is one system's rounds of one cell, added up. Rates are totals
// over totals (calls over measured time), not averages of per-round rates,
// and latencies come from the merged histogram of every round.
type result struct {
	calls     uint64
	elapsed   time.Duration
	hist      histogram
	client    procStats     // the harness process over the measured windows
	server    procStats     // the server process over the same windows
	others    time.Duration // CPU time other processes took meanwhile; othersUnknown if a round could not tell
	roundQPS  []float64
	stretched int // rounds whose window stayed open past its length for a first call
	cold      int // many mode: client processes whose heap was not warm within their warmLimit
}

func (r *result) qps() float64 { return float64(r.calls) / r.elapsed.Seconds() }

// perCall divides a total over the measured calls.
func (r *result) perCall(total float64) float64 {
	if r.calls == 0 {
		return 0
	}
	return total / float64(r.calls)
}

// spread is half the range of the round rates, relative to the overall
// rate: how much to trust a difference of a few percent.
func (r *result) spread() float64 {
	if len(r.roundQPS) < 2 {
		return 0
	}
	lo, hi := r.roundQPS[0], r.roundQPS[0]
	for _, q := range r.roundQPS {
		lo, hi = min(lo, q), max(hi, q)
	}
	return (hi - lo) / 2 / r.qps()
}

// benchmark is a finished run: the matrix and a result per cell and system.
type benchmark struct {
	opts     options
	cells    []cell
	results  map[cell][]*result // indexed like opts.systems; nil for a system that sat the cell's mode out
	codecs   []codecResult      // with -codecs
	started  time.Time
	finished time.Time
}

// runBenchmarks starts one server process per system (re-executing exe),
// runs every cell, and stops the servers whatever happens. Within a cell the
// systems take turns round by round, so that a noisy second on the machine
// hits all of them alike rather than one system's whole measurement; so do
// the many mode's cells of one payload (turnGroups).
func runBenchmarks(ctx context.Context, exe string, o options) (*benchmark, error) {
	b := &benchmark{opts: o, cells: o.cells(), results: map[cell][]*result{}, started: time.Now()}
	for i, c := range b.cells {
		// Results are keyed by cell: a cell listed twice would share one
		// result, and its rounds be added up twice (or dropped).
		if slices.Contains(b.cells[:i], c) {
			return nil, fmt.Errorf("cell %s is listed twice", c)
		}
	}
	servers := make([]*childProcess, len(o.systems))
	defer func() {
		for _, s := range servers {
			if s != nil {
				s.stop()
			}
		}
	}()
	for i, sys := range o.systems {
		s, err := startServer(ctx, exe, sys, o.profileDir, o.server)
		if err != nil {
			return nil, err
		}
		servers[i] = s
	}

	for _, group := range turnGroups(b.cells) {
		if err := b.runGroup(ctx, exe, servers, group); err != nil {
			return nil, err
		}
	}
	b.finished = time.Now()
	for i, s := range servers {
		servers[i] = nil
		if err := s.stop(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// roundResult is one measured window of one system.
type roundResult struct {
	elapsed        time.Duration
	stretched      bool // the window stayed open past its length for a first call
	cold           int  // many mode: client processes not warm within their warmLimit
	hist           histogram
	client, server procStats
	others         time.Duration // CPU time of every other process; othersUnknown without /proc
}

func (r *roundResult) qps() float64 { return float64(r.hist.n) / r.elapsed.Seconds() }

func (r *result) add(rr *roundResult) {
	r.calls += rr.hist.n
	r.elapsed += rr.elapsed
	r.hist.merge(&rr.hist)
	r.client.mallocs += rr.client.mallocs
	r.client.cpu += rr.client.cpu
	r.server.mallocs += rr.server.mallocs
	r.server.cpu += rr.server.cpu
	r.server.logs += rr.server.logs
	if rr.others < 0 || r.others < 0 {
		r.others = othersUnknown
	} else {
		r.others += rr.others
	}
	r.roundQPS = append(r.roundQPS, rr.qps())
	if rr.stretched {
		r.stretched++
	}
	r.cold += rr.cold
}

// Caller phases: calls during warm-up and after the window are not counted.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// roundPhase is the phase a round's callers are in, and whether the window
// has counted a call yet: a round whose window ends before any call
// completes (a slow system on a loaded machine) stays open until one does,
// rather than losing the run.
type roundPhase struct {
	atomic.Int32
	first   atomic.Bool
	counted chan struct{} // closed by the first call the window counts
}

func newRoundPhase() *roundPhase { return &roundPhase{counted: make(chan struct{})} }

// countedOne is called by a caller whose first call in the window
// completed; only the first such call closes counted.
func (p *roundPhase) countedOne() {
	if p.counted != nil && p.first.CompareAndSwap(false, true) {
		close(p.counted)
	}
}

// stretchLimit bounds how long a window stays open past its length for a
// first call: a call that takes longer hangs, and the round fails.
const stretchLimit = childWait

// runRound makes a fresh client, runs c.callers callers through a warm-up
// and a measured window, and returns what the window saw. In the short
// mode there is no shared client: each call makes and closes its own.
//
// The window's edges are where the counters are read: the server's stats
// (which allocate in the harness, to parse the answer) are taken outside
// the client's snapshots, and nothing between the two client snapshots
// allocates except the callers' calls, so the client's allocations per call
// are the framework's own.
func runRound(ctx context.Context, sys *system, srv *childProcess, c cell, o options) (*roundResult, error) {
	// Garbage from the previous round (another system's) is collected now,
	// not on this system's CPU time.
	runtime.GC()
	var cli echoClient
	if c.mode == modeLong || c.mode == modeStream {
		var err error
		if cli, err = sys.dial(ctx, srv.addr); err != nil {
			return nil, err
		}
		defer cli.Close()
	}
	sc, _ := cli.(streamClient)
	if c.mode == modeStream && sc == nil {
		return nil, errNoStream
	}

	phase := newRoundPhase()
	hists := make([]*histogram, c.callers)
	errs := make(chan error, c.callers)
	var wg sync.WaitGroup
	for i := range hists {
		hists[i] = new(histogram)
		payload := make([]byte, c.payload)
		for j := range payload {
			payload[j] = byte(i + j)
		}
		var call callFunc
		var done func() error // ends the caller's work after its loop
		switch {
		case c.mode == modeStream:
			call, done = streamCaller(sc, c.payload)
		case cli != nil:
			call = cli.newCaller(payload)
		default:
			call = shortCaller(sys, srv.addr, payload)
		}
		h := hists[i]
		loop := callLoop
		if c.mode == modeStream {
			loop = streamLoop
		}
		wg.Go(func() {
			err := loop(ctx, call, len(payload), phase, h)
			if done != nil {
				if derr := done(); err == nil && derr != nil {
					err = fmt.Errorf("close the stream: %w", derr)
				}
			}
			if err != nil {
				errs <- err
			}
		})
	}
	stopCallers := func() error {
		phase.Store(phaseStop)
		if err := waitGroupTimeout(&wg, childWait); err != nil {
			return fmt.Errorf("%w; %s", err, dumpHang(ctx, sys, srv))
		}
		return nil
	}

	timer := time.NewTimer(o.warmup) // made here: Reset below does not allocate
	defer timer.Stop()
	if err := sleep(ctx, timer, errs); err != nil {
		return nil, errors.Join(err, stopCallers())
	}
	srvStart, err := srv.stats(ctx)
	if err != nil {
		return nil, errors.Join(err, stopCallers())
	}
	busyStart, haveBusy := machineBusy()
	cliStart := readProcStats()
	phase.Store(phaseMeasure)
	t0 := time.Now()
	timer.Reset(o.windowOf(c))
	err = sleep(ctx, timer, errs)
	stretched := false
	if err == nil {
		stretched, err = awaitCounted(ctx, phase, errs)
		if err != nil {
			err = fmt.Errorf("%w; %s", err, dumpHang(ctx, sys, srv))
		}
	}
	phase.Store(phaseStop)
	elapsed := time.Since(t0)
	cliEnd := readProcStats()
	busyEnd, _ := machineBusy()
	if err != nil {
		return nil, errors.Join(err, stopCallers())
	}
	srvEnd, err := srv.stats(ctx)
	if werr := stopCallers(); err == nil {
		err = werr
	}
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	if err != nil {
		return nil, err
	}

	rr := &roundResult{elapsed: elapsed, stretched: stretched, client: cliEnd.sub(cliStart), server: srvEnd.sub(srvStart)}
	rr.others = othersUnknown
	if haveBusy {
		rr.others = max(0, busyEnd-busyStart-rr.client.cpu-rr.server.cpu)
	}
	for _, h := range hists {
		rr.hist.merge(h)
	}
	return rr, nil
}

// awaitCounted waits, once the window's time is up, until the window has
// counted a call, reporting whether it had to wait; a caller's error, the
// run's end or stretchLimit without a call ends the wait with an error.
func awaitCounted(ctx context.Context, phase *roundPhase, errs <-chan error) (bool, error) {
	select {
	case <-phase.counted:
		return false, nil
	default:
	}
	limit := time.NewTimer(stretchLimit)
	defer limit.Stop()
	select {
	case <-phase.counted:
		return true, nil
	case err := <-errs:
		return true, err
	case <-ctx.Done():
		return true, ctx.Err()
	case <-limit.C:
		return true, fmt.Errorf("no call completed in the window nor in the %s after it: a call hangs", stretchLimit)
	}
}

// windowOf is the measured time of a round of c.
func (o *options) windowOf(c cell) time.Duration {
	if c.mode == modeStream && o.streamDuration > 0 {
		return o.streamDuration
	}
	return o.duration
}

// callLoop calls until the phase says stop, recording each call's latency
// while the window is open. One clock read per call: a call's end is the
// next one's start.
func callLoop(ctx context.Context, call callFunc, want int, phase *roundPhase, h *histogram) error {
	// Since a base reads the monotonic clock alone, half of what a
	// time.Now costs.
	base := time.Now()
	var start time.Duration
	for {
		n, err := call(ctx)
		end := time.Since(base)
		if err := checkEcho(n, want, err); err != nil {
			return err
		}
		switch phase.Load() {
		case phaseMeasure:
			h.record(end - start)
			if h.n == 1 {
				phase.countedOne()
			}
		case phaseStop:
			return nil
		}
		start = end
	}
}

// streamLoop is callLoop for the messages of a stream, which come a few
// hundred ns apart: a clock read for each, some 25 ns here, would be a
// tenth of what is measured, paid by every system but weighing most on the
// fastest. So it counts every message and times the gap before about one
// in gapStride, taken at a stride drawn from [gapStride/2, 3·gapStride/2)
// so that the samples cannot fall in step with a batching pattern.
func streamLoop(ctx context.Context, call callFunc, want int, phase *roundPhase, h *histogram) error {
	base := time.Now()
	rng := uint32(base.UnixNano()) | 1 // xorshift needs a seed other than 0
	var start time.Duration
	untilTimed := gapStride // messages left before the next timed gap ends
	for {
		n, err := call(ctx)
		if err := checkEcho(n, want, err); err != nil {
			return err
		}
		untilTimed--
		var end time.Duration
		if untilTimed <= 1 {
			end = time.Since(base)
		}
		switch phase.Load() {
		case phaseMeasure:
			if untilTimed == 0 {
				h.record(end - start)
			} else {
				h.tally()
			}
			if h.n == 1 {
				phase.countedOne()
			}
		case phaseStop:
			return nil
		}
		switch untilTimed {
		case 1:
			start = end
		case 0:
			rng ^= rng << 13 // xorshift32
			rng ^= rng >> 17
			rng ^= rng << 5
			untilTimed = gapStride/2 + int(rng%gapStride)
		}
	}
}

// checkEcho is what the loops make of one call: its error, or an echo of
// the wrong size.
func checkEcho(n, want int, err error) error {
	if err != nil {
		return fmt.Errorf("call failed: %w", err)
	}
	if n != want {
		return fmt.Errorf("echo came back with %d bytes, sent %d", n, want)
	}
	return nil
}

// gapStride is how many messages streamLoop counts, on average, for each
// gap it times.
const gapStride = 16

// sleep waits for timer, a caller's failure or ctx, whichever comes first.
func sleep(ctx context.Context, timer *time.Timer, errs <-chan error) error {
	select {
	case <-timer.C:
		return nil
	case err := <-errs:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func waitGroupTimeout(wg *sync.WaitGroup, d time.Duration) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return errors.New("callers still busy " + d.String() + " after the round ended: a call hangs (is the server process alive?)")
	}
}

// dumpHang writes the goroutine stacks of the harness and of the server to
// files, for finding out where a hanging call is stuck, and says where.
func dumpHang(ctx context.Context, sys *system, srv *childProcess) string {
	base := filepath.Join(os.TempDir(), fmt.Sprintf("kernrpc-bench-hang-%s-%d", sys.name, os.Getpid()))
	msg := "goroutine stacks: client in " + base + "-client.txt"
	if err := dumpGoroutines(base + "-client.txt"); err != nil {
		msg = "client stacks not written: " + err.Error()
	}
	if err := srv.dump(ctx, base+"-server.txt"); err != nil {
		return msg + "; server stacks not written: " + err.Error()
	}
	return msg + ", server in " + base + "-server.txt"
}

// noisyShare is the share of the machine's CPU time other processes may
// take during a window before the run is reported as disturbed.
const noisyShare = 0.05

// othersUnknown is the CPU time of other processes where the machine
// cannot tell it (no /proc/stat): the report then says it was not
// measured, rather than 0%, which would pass for a quiet machine.
const othersUnknown time.Duration = -1

// othersShare is the fraction of the machine's CPU capacity over elapsed
// that other processes used.
func othersShare(others, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(others) / (float64(elapsed) * float64(runtime.NumCPU()))
}
