package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The many mode: -clients client processes, each one client of the system
// shared by -client-callers callers, against the one server process, as
// many small services calling one do. The harness re-executes itself for
// each client process as
//
//	benchmarks -client=kernrpc -addr=127.0.0.1:40123 -callers=4 -payload=16 -warm-limit=8s
//
// Protocol on the client child's stdin and stdout, one line each:
//
//	child:   ready                  its callers are calling, its heap is warm (awaitWarmHeap)
//	   or:   ready cold             the same, but its heap did not get warm within -warm-limit
//	harness: start                  the measured window opens
//	harness: stop                   and closes
//	child:   result <calls> <window ns> <mallocs> <cpu ns> <histogram>
//	   or:   error <what failed>
//
// The child exits when its stdin closes, like a server child. The round's
// calls/s are all processes' calls over the harness's window; the server's
// CPU per call is its CPU time over that window (read by the harness just
// before "start" and after the last "result") ÷ those calls.

// clientFlag marks a client child; like serveFlag, -h does not show it.
const clientFlag = "-client="

// isClientChild reports whether args ask for a client child.
func isClientChild(args []string) bool { return hasChildFlag(args, clientFlag) }

// clientMain runs one client child and returns the exit code.
func clientMain(args []string) int {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	name := fs.String("client", "", "system to call: "+strings.Join(systemOrder, ", "))
	addr := fs.String("addr", "", "the server's address")
	callers := fs.Int("callers", 1, "concurrent callers sharing this process's client")
	payload := fs.Int("payload", modePayload, "payload bytes")
	limit := fs.Duration("warm-limit", warmLimit(1), "longest wait for a warm heap before saying ready cold")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	sys, ok := systems[*name]
	if !ok || *addr == "" || *callers < 1 || *payload < 0 || *payload > maxPayload || *limit <= 0 {
		fmt.Fprintf(os.Stderr, "benchmarks -client: want a known -client (%s), an -addr, -callers ≥ 1, -payload up to %d and a positive -warm-limit; got %q %q %d %d %s\n",
			strings.Join(systemOrder, ", "), maxPayload, *name, *addr, *callers, *payload, *limit)
		return 2
	}
	slog.SetLogLoggerLevel(slog.LevelWarn) // as in a server child
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	if err := runClientChild(ctx, sys, *addr, *callers, *payload, *limit, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "benchmarks -client=%s: %v\n", *name, err)
		return 1
	}
	return 0
}

// runClientChild is the client child's side of the protocol above.
func runClientChild(ctx context.Context, sys *system, addr string, callers, size int, warmWait time.Duration, in io.Reader, out io.Writer) error {
	cli, err := sys.dial(ctx, addr)
	if err != nil {
		fmt.Fprintf(out, "error %s\n", oneLine(err))
		return err
	}
	defer cli.Close()

	phase := new(roundPhase) // the harness, not this process, reads the window
	hists := make([]*histogram, callers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range hists {
		hists[i] = new(histogram)
		payload := make([]byte, size)
		for j := range payload {
			payload[j] = byte(i + j)
		}
		call, h := cli.newCaller(payload), hists[i]
		wg.Go(func() {
			if err := callLoop(ctx, call, len(payload), phase, h); err != nil {
				errs <- err
			}
		})
	}
	stopped := false
	stopCallers := func() error {
		stopped = true
		phase.Store(phaseStop)
		return waitGroupTimeout(&wg, childWait)
	}
	defer func() {
		if !stopped {
			stopCallers()
		}
	}()
	if awaitWarmHeap(ctx, errs, warmWait) {
		fmt.Fprintln(out, readyLine)
	} else {
		fmt.Fprintln(out, readyColdLine)
	}

	sc := bufio.NewScanner(in)
	// Bytes, not Text: reading "stop" must not allocate inside the window.
	if !sc.Scan() || string(sc.Bytes()) != "start" {
		return nil // the harness went away or gave up on this round
	}
	start := readProcStats()
	phase.Store(phaseMeasure)
	t0 := time.Now()
	if !sc.Scan() {
		return nil
	}
	phase.Store(phaseStop)
	elapsed := time.Since(t0)
	end := readProcStats()
	err = stopCallers()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	if err != nil {
		fmt.Fprintf(out, "error %s\n", oneLine(err))
	} else {
		var h histogram
		for _, hh := range hists {
			h.merge(hh)
		}
		d := end.sub(start)
		fmt.Fprintf(out, "result %d %d %d %d %s\n", h.n, elapsed.Nanoseconds(), d.mallocs, d.cpu.Nanoseconds(), h.encode())
	}
	for sc.Scan() { // wait for the harness to close stdin
	}
	return nil
}

// A client process is warm once its heap has stopped growing into pages
// it never touched: until then each large answer it decodes lands on
// fresh pages, and each page costs a fault. A process making a few hundred
// to a few thousand 64 KiB calls a second grows through the engine's GC
// headroom (gcheadroom.go) for a second or more, paying those faults all
// the while, which a long-lived client pays once: eight such clients of
// one shm-ring server did 18.8k calls/s after the fixed warm-up alone and
// 24.7k after 4 s. So a client child reports ready only once, over a
// warmSpan in which it ran for warmMinCPU or more, it faulted fewer than
// warmFaultRate pages per millisecond of its CPU time; or once its heap
// has been collected warmCycles times since its callers began (its later
// answers reuse what those freed); or at its cell's warmLimit, then
// saying it is cold. Every system's clients wait by the same rule; the
// harness's -warmup follows. Faults are weighed against CPU time, not
// counted, so that a process the kernel kept from a core through a span
// does not pass for warm: with 32 clients on two cores a plain count let
// every one of them through cold.
const (
	warmSpan      = 200 * time.Millisecond
	warmMinCPU    = 5 * time.Millisecond
	warmFaultRate = 10 // a cold 64 KiB client faults 16 pages a call, 50-400 a millisecond
	// The first cycle may be the one the headroom's own allocation
	// starts; the second has reclaimed garbage of the headroom's size.
	warmCycles = 2
	// The processes of a cell share the machine's cores while they warm,
	// so the wait grows with their number: 32 single-caller 64 KiB
	// clients of a shm-ring server on two cores took 6.8-12.2 s, where a
	// fixed 8 s left 53 of 96 cold and their cell at 0.77× one client.
	warmLimitMin       = 8 * time.Second
	warmLimitPerClient = 500 * time.Millisecond
)

// warmLimit is how long each of a cell's client processes waits for a
// warm heap.
func warmLimit(clients int) time.Duration {
	return max(warmLimitMin, time.Duration(clients)*warmLimitPerClient)
}

// warmRule says the rule above in a few words, for -h and the report.
func warmRule() string {
	return fmt.Sprintf("fewer than %d page faults per millisecond of its CPU time over %s, or %d collections, at most %s or %s a client process",
		warmFaultRate, warmSpan, warmCycles, warmLimitMin, warmLimitPerClient)
}

// The client child's first line, and whether its heap got warm.
const (
	readyLine     = "ready"
	readyColdLine = "ready cold"
)

// awaitWarmHeap waits until this process is warm (above), ctx ends or a
// caller has failed, and reports whether it is warm; a failed caller's
// error reaches the harness on the result line.
func awaitWarmHeap(ctx context.Context, errs <-chan error, limit time.Duration) bool {
	sample := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	cycles := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	var ru syscall.Rusage
	usage := func() (faults int64, cpu time.Duration) {
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // cannot fail for RUSAGE_SELF
		// int64: the fields are int32 on 32-bit systems.
		return int64(ru.Minflt) + int64(ru.Majflt), time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	baseCycles := cycles()
	lastFaults, lastCPU := usage()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(warmSpan)
	defer tick.Stop()
	for time.Now().Before(deadline) && len(errs) == 0 {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if cycles()-baseCycles >= warmCycles {
			return true
		}
		f, cpu := usage()
		if judged, warm := spanWarm(f-lastFaults, cpu-lastCPU); warm {
			return true
		} else if judged {
			lastFaults, lastCPU = f, cpu
		}
	}
	return false
}

// spanWarm judges the span since the last judged one: whether the process
// ran long enough in it to tell, and if so whether it faulted fewer than
// warmFaultRate pages per millisecond of its CPU time. A span too short
// is judged with the next.
func spanWarm(faults int64, ran time.Duration) (judged, warm bool) {
	if ran < warmMinCPU {
		return false, false
	}
	return true, faults*int64(time.Millisecond) < warmFaultRate*int64(ran)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// runManyRound starts c.clients client processes against srv, lets them
// warm up, opens the window on all of them at once, and adds up what they
// measured. The processes are fresh every round, as runRound's client is.
func runManyRound(ctx context.Context, exe string, sys *system, srv *childProcess, c cell, o options) (*roundResult, error) {
	runtime.GC()
	args := []string{clientFlag + sys.name, "-addr=" + srv.addr,
		"-callers=" + strconv.Itoa(c.callers), "-payload=" + strconv.Itoa(c.payload),
		"-warm-limit=" + warmLimit(c.clients).String()}
	clients := make([]*childProcess, 0, c.clients)
	defer func() {
		for _, p := range clients {
			p.stop()
		}
	}()
	for range c.clients {
		p, err := startChild(ctx, exe, sys, "client", args)
		if err != nil {
			return nil, err
		}
		clients = append(clients, p)
	}
	cold := 0
	for i, p := range clients {
		// Each process warms at once with the others: the last may answer
		// a whole warm limit after the first.
		l, err := p.readLineWithin(ctx, warmLimit(c.clients)+childWait)
		switch {
		case err != nil:
		case l == readyColdLine:
			cold++
		case l != readyLine:
			err = errors.New(strings.TrimPrefix(l, "error "))
		}
		if err != nil {
			return nil, fmt.Errorf("client process %d of %d did not start calling: %w", i+1, len(clients), err)
		}
	}
	timer := time.NewTimer(o.warmup)
	defer timer.Stop()
	if err := sleep(ctx, timer, nil); err != nil {
		return nil, err
	}
	srvStart, err := srv.stats(ctx)
	if err != nil {
		return nil, err
	}
	busyStart, haveBusy := machineBusy()
	if err := tellAll(clients, "start"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	timer.Reset(o.duration)
	err = sleep(ctx, timer, nil)
	werr := tellAll(clients, "stop")
	elapsed := time.Since(t0)
	busyEnd, _ := machineBusy()
	if err = errors.Join(err, werr); err != nil {
		return nil, err
	}

	rr := &roundResult{elapsed: elapsed, cold: cold}
	for i, p := range clients {
		l, err := p.readLine(ctx)
		if err == nil {
			err = rr.addClient(l)
		}
		if err != nil {
			return nil, fmt.Errorf("client process %d of %d: %w", i+1, len(clients), err)
		}
	}
	srvEnd, err := srv.stats(ctx)
	if err != nil {
		return nil, err
	}
	rr.server = srvEnd.sub(srvStart)
	rr.others = othersUnknown
	if haveBusy {
		rr.others = max(0, busyEnd-busyStart-rr.client.cpu-rr.server.cpu)
	}
	if rr.hist.n == 0 {
		return nil, fmt.Errorf("no call completed in %s; lengthen -duration", o.duration)
	}
	return rr, nil
}

// tellAll writes line to every child's stdin.
func tellAll(ps []*childProcess, line string) error {
	var errs []error
	for i, p := range ps {
		if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
			errs = append(errs, fmt.Errorf("client process %d: %s: %w", i+1, line, err))
		}
	}
	return errors.Join(errs...)
}

// addClient adds a client child's "result" line to the round.
func (rr *roundResult) addClient(line string) error {
	if msg, ok := strings.CutPrefix(line, "error "); ok {
		return errors.New(msg)
	}
	f := strings.SplitN(line, " ", 6)
	if len(f) != 6 || f[0] != "result" {
		return fmt.Errorf("answer %q is not \"result <calls> <ns> <mallocs> <cpu ns> <histogram>\"", line)
	}
	var v [4]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("answer %q: field %d is not a count", line, i+2)
		}
		v[i] = n
	}
	var h histogram
	if err := h.decode(f[5]); err != nil {
		return fmt.Errorf("answer %q: %w", line, err)
	}
	if h.n != uint64(v[0]) {
		return fmt.Errorf("answer %q: %d calls but a histogram of %d", line, v[0], h.n)
	}
	rr.hist.merge(&h)
	rr.client.mallocs += uint64(v[2])
	rr.client.cpu += time.Duration(v[3])
	return nil
}

// manyTogether writes, where the many mode ran one client process beside
// more, each system's rows divided by its row of one process with the
// same payload and callers: whether many clients of one server together
// beat one client (issue 18 asks it of shm-ring at 64 KiB).
func (b *benchmark) manyTogether(w *strings.Builder) {
	t := table{header: []string{"system", "payload", "clients × callers", "calls/s", "client CPU/call", "server CPU/call"}}
	for _, i := range b.modeSystems(modeMany) {
		for _, one := range b.cells {
			if one.mode != modeMany || one.clients != 1 || b.results[one][i] == nil {
				continue
			}
			base := b.results[one][i]
			for _, c := range b.cells {
				if c.mode != modeMany || c.clients == 1 || c.payload != one.payload || c.callers != one.callers {
					continue
				}
				r := b.results[c][i]
				if r == nil {
					continue
				}
				t.add(b.opts.systems[i].label, sizeName(c.payload), c.callersName()+" ÷ "+one.callersName(),
					fmtRatio(r.qps(), base.qps()),
					fmtRatio(r.perCall(float64(r.client.cpu)), base.perCall(float64(base.client.cpu))),
					fmtRatio(r.perCall(float64(r.server.cpu)), base.perCall(float64(base.server.cpu))))
			}
		}
	}
	if len(t.rows) == 0 {
		return
	}
	w.WriteString("### many: client processes together ÷ one\n\n" +
		"Each system's rows divided by its row of one client process with the same payload and callers each: " +
		"above 1 for calls/s, the processes together did more than one did alone; the CPU a call counts all client " +
		"processes, then the server.\n\n")
	t.write(w)
}
