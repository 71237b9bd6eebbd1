// Command kernrpc-soak runs mixed traffic for a long time in one process
// against servers it starts itself, and fails if goroutines, open files or
// the heap keep growing.
//
//	go run ./cmd/kernrpc-soak -duration 10m
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"time"

	_ "github.com/kernrpc/kernrpc/plugins/all" // every transport and codec the traffic uses
)

const usage = `Usage: kernrpc-soak [-duration D] [flags]

Starts an echo server over tcp-lv, one over shm-ring and one over tcp-lv
through the faulty transport (both sides lose, duplicate or delay a frame
now and then, and reset a connection), then runs -callers goroutines
calling them through a client per transport and codec
(protobuf, json, msgpack, flatbuffers) with payloads from 0 to 256 KiB:
plain and asynchronous calls, calls with deadlines of 1-20 ms the server
may outlast, calls cancelled while they run, and one time in five a stream
(bidirectional or server-streaming, 1-16 messages, one in four given up
part way). Every -churn one client is closed and a new one opened in its
place.

Every -interval it pauses the calls, runs two GCs and prints goroutines, heap
in use, open file descriptors (/proc/self/fd) and the calls and streams so
far. The start is the highest of the first 3 samples after -warmup, the
end the lowest of the last 3 (the last taken after the traffic stopped;
fewer of each when there are under 6, so that the two share none),
so that memory that comes and goes is not taken for a leak. It exits 1
if, from start to end, goroutines grew by more than -goroutine-margin,
open files by more than -fd-margin, or the heap by more than
-heap-tolerance of the start plus -heap-slack; if, once everything is
shut down and up to -settle has passed, more goroutines or files are left
than before it started (same margins) or more heap than before plus
-heap-slack; or if
any call or stream failed other than by its own deadline or cancellation
(or, over the faulty transport, by a fault: its 1 s deadline for calls and
3 s for streams, or Unavailable), or got a wrong answer.

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	duration, interval, warmup, churn time.Duration
	settle                            time.Duration
	callers                           int
	seed                              uint64
	limits                            limits
	heapProfile                       string
	// profile is heapProfile, created before the traffic starts so that
	// a path that cannot be written is found then, not after -duration.
	profile *os.File
}

// errBadFlag is a flag that did not parse, already reported with the
// usage by the flag package.
var errBadFlag = errors.New("bad flag")

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("kernrpc-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	o := &options{}
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the traffic runs")
	fs.DurationVar(&o.interval, "interval", 10*time.Second, "how often to print the figures")
	fs.DurationVar(&o.warmup, "warmup", time.Minute, "figures before this are not the start (at most a third of -duration)")
	fs.DurationVar(&o.churn, "churn", 200*time.Millisecond, "how often a client is replaced by a new one")
	fs.DurationVar(&o.settle, "settle", 40*time.Second, "after shutdown, how long to wait for goroutines, open files and the heap to come back "+
		"(the GC headroom stays 30s after the last client or server closes)")
	fs.IntVar(&o.callers, "callers", 8, "goroutines making calls")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed of the random traffic")
	fs.IntVar(&o.limits.goroutines, "goroutine-margin", 16, "goroutines the end may have beyond the start")
	fs.IntVar(&o.limits.fds, "fd-margin", 8, "open files the end may have beyond the start")
	fs.Float64Var(&o.limits.heapRatio, "heap-tolerance", 0.5, "heap growth allowed, as a fraction of the start's heap")
	fs.StringVar(&o.heapProfile, "heapprofile", "", "write a heap profile here once the traffic stops, before shutdown (to see what a growing heap holds)")
	slack := fs.Int("heap-slack", 8, "heap growth allowed beyond -heap-tolerance, in MiB (buffer pools hold a few large buffers)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errBadFlag // the flag package printed it, and the usage
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.duration <= 0 || o.interval <= 0 || o.churn <= 0 || o.callers <= 0 || o.settle <= 0 {
		return nil, errors.New("-duration, -interval, -churn, -callers and -settle must be positive")
	}
	// A negative -heap-slack would wrap to a huge allowance and pass any
	// heap growth; negative margins would fail every run.
	if o.warmup < 0 || o.limits.goroutines < 0 || o.limits.fds < 0 || o.limits.heapRatio < 0 || *slack < 0 {
		return nil, errors.New("-warmup, -goroutine-margin, -fd-margin, -heap-tolerance and -heap-slack must not be negative")
	}
	// NaN passes the check above, and neither it nor Inf converts to a
	// byte count: the heap limit would pass any growth (or fail any run).
	if math.IsNaN(o.limits.heapRatio) || math.IsInf(o.limits.heapRatio, 0) {
		return nil, fmt.Errorf("-heap-tolerance %v: want a finite fraction, such as 0.5", o.limits.heapRatio)
	}
	o.warmup = min(o.warmup, o.duration/3)
	o.limits.heapSlack = uint64(*slack) << 20
	o.limits.afterGoroutines, o.limits.afterFDs = o.limits.goroutines, o.limits.fds
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errBadFlag) {
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "kernrpc-soak:", err)
		return 2
	}
	if o.heapProfile != "" {
		if o.profile, err = os.Create(o.heapProfile); err != nil {
			fmt.Fprintln(stderr, "kernrpc-soak: -heapprofile:", err)
			return 2
		}
		defer func() {
			if o.profile != nil { // the soak ended before the traffic stopped
				o.profile.Close()
				os.Remove(o.heapProfile)
			}
		}()
	}
	logs := newFaultLogs(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	log := slog.New(logs)
	slog.SetDefault(log) // the engine's own informational lines would drown the figures
	err = soak(ctx, o, stdout, log)
	fmt.Fprintf(stdout, "%d lines the engine logged at WARN about the faulty service were counted, not shown\n", logs.hidden.Load())
	if err != nil {
		fmt.Fprintln(stderr, "kernrpc-soak:", err)
		return 1
	}
	return 0
}

var errGrew = errors.New("figures grew beyond their margins")

func soak(ctx context.Context, o *options, stdout io.Writer, log *slog.Logger) error {
	before, err := sample(0)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "soak for %s (seed %d, %d callers, warm-up %s); before start: %s\n", o.duration, o.seed, o.callers, o.warmup, before)
	t, err := startTraffic(ctx, log, o.seed)
	if err != nil {
		return err
	}
	start := time.Now()
	steady, err := drive(ctx, t, o, start, stdout)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted after %s of %s: no verdict", time.Since(start).Round(time.Second), o.duration)
	}
	if err == nil && len(steady) < 2 {
		err = fmt.Errorf("only %d sample after the warm-up (%s), too few to tell growth from noise: lengthen -duration or shorten -interval", len(steady), o.warmup)
	}
	if err != nil {
		t.stop()
		return err
	}
	if err := writeHeapProfile(o); err != nil {
		t.stop()
		return err
	}
	if err := t.stop(); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	fmt.Fprintf(stdout, "shut down; waiting up to %s for goroutines, open files and the heap to come back\n", o.settle)
	after, err := settle(ctx, before, o.limits, time.Since(start), o.settle)
	if err != nil {
		return err
	}
	warm, end := startAndEnd(steady)
	bad := o.limits.verdict(before, warm, end, after, &t.counts)
	report(stdout, sampleWindow(len(steady)), before, warm, end, after, bad)
	if len(bad) > 0 {
		return errGrew
	}
	return nil
}

// drive runs the callers and the churner until the duration ends,
// sampling every interval, and returns the samples from the warm-up on,
// the last one taken after the traffic stopped.
func drive(ctx context.Context, t *traffic, o *options, start time.Time, stdout io.Writer) ([]figures, error) {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range o.callers {
		wg.Go(func() { t.callLoop(ctx, i, o.seed) })
	}
	wg.Go(func() { t.churn(ctx, o.churn, rand.New(rand.NewPCG(o.seed, 1<<32))) })
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	var steady []figures
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		f, err := t.quiesced(time.Since(start))
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		progress(stdout, f, o.duration, &t.counts)
		if f.at >= o.warmup {
			if len(steady) == 0 {
				fmt.Fprintf(stdout, "warm-up over at %s\n", f.at.Round(time.Second))
			}
			steady = append(steady, f)
		}
	}
	wg.Wait()
	end, err := t.quiesced(time.Since(start))
	if err != nil {
		return nil, err
	}
	progress(stdout, end, o.duration, &t.counts)
	return append(steady, end), nil
}

// window is how many samples the start and the end figures are taken
// from: the heap after GC with no call in flight still swings by tens of
// MiB between samples (pooled buffers of 256 KiB payloads), so the start
// is the highest of the first samples after the warm-up and the end the
// lowest of the last ones. Memory that leaks raises the floor above the
// early peaks; memory that comes and goes does not.
const window = 3

// sampleWindow is how many of n samples the start and the end are each
// taken from: window, or fewer so that the two never share a sample (with
// shared samples the end, a minimum, could never exceed the start, a
// maximum, and nothing could be seen to grow); one sample is both.
func sampleWindow(n int) int { return max(1, min(window, n/2)) }

// startAndEnd returns each figure's maximum over the first samples and its
// minimum over the last ones (sampleWindow of them each).
func startAndEnd(steady []figures) (start, end figures) {
	k := sampleWindow(len(steady))
	first, last := steady[:k], steady[len(steady)-k:]
	start, end = first[0], last[len(last)-1]
	for _, f := range first {
		start.goroutines, start.heap, start.fds = max(start.goroutines, f.goroutines), max(start.heap, f.heap), max(start.fds, f.fds)
	}
	for _, f := range last {
		end.goroutines, end.heap, end.fds = min(end.goroutines, f.goroutines), min(end.heap, f.heap), min(end.fds, f.fds)
	}
	return start, end
}

// writeHeapProfile writes the heap profile into o.profile, created when
// the soak started, and closes it.
func writeHeapProfile(o *options) error {
	f := o.profile
	if f == nil {
		return nil
	}
	o.profile = nil
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("heap profile %s: %w", o.heapProfile, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("heap profile %s: %w", o.heapProfile, err)
	}
	return nil
}

// quiesced samples with no call in flight: callers wait while it holds
// the lock they share.
func (t *traffic) quiesced(at time.Duration) (figures, error) {
	t.quiet.Lock()
	defer t.quiet.Unlock()
	time.Sleep(20 * time.Millisecond) // server goroutines of calls just cancelled return
	return sample(at)
}

// settle samples after shutdown until goroutines, open files and the heap
// are back within their margins of before the start, or for at most d:
// connections' goroutines take a moment to notice they are closed, the
// buffer pools give back their buffers a second or two after their last
// use, and the GC headroom stays 30 s after the last holder closes.
// An interrupt ends the wait, with no verdict.
func settle(ctx context.Context, before figures, l limits, at, d time.Duration) (figures, error) {
	deadline := time.Now().Add(d)
	for {
		if ctx.Err() != nil {
			return figures{}, fmt.Errorf("interrupted after shutdown, while waiting for the figures to come back: no verdict")
		}
		f, err := sample(at)
		if err != nil || time.Now().After(deadline) || len(l.afterShutdown(before, f)) == 0 {
			return f, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}
