package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// figures are what a sample reads with no call in flight.
type figures struct {
	at         time.Duration // since the soak started
	goroutines int
	heap       uint64 // bytes in heap spans in use, after a GC
	fds        int
}

// sample reads the figures after two GCs, so that the heap is what is
// live, not what awaits collection or sits in sync.Pool's victim cache.
func sample(at time.Duration) (figures, error) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return figures{}, fmt.Errorf("count open files: %w", err)
	}
	return figures{at: at, goroutines: runtime.NumGoroutine(), heap: ms.HeapInuse, fds: len(fds)}, nil
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func (f figures) String() string {
	return fmt.Sprintf("goroutines %d, heap %s, fds %d", f.goroutines, mib(f.heap), f.fds)
}

// limits are how much each figure may grow before the soak fails.
type limits struct {
	goroutines, fds   int     // steady state, absolute
	heapRatio         float64 // steady state: a fraction of the warm heap...
	heapSlack         uint64  // ...plus this much
	afterGoroutines   int     // after shutdown, against before the start
	afterFDs          int
	allowFailedCalls  int64
	allowWrongAnswers int64
}

// verdict compares the figures and returns one line per limit exceeded.
func (l limits) verdict(before, warm, end, after figures, c *counts) []string {
	var bad []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	heapMax := uint64(float64(warm.heap)*(1+l.heapRatio)) + l.heapSlack
	check(end.goroutines <= warm.goroutines+l.goroutines, "goroutines grew from %d after warm-up to %d (margin %d)", warm.goroutines, end.goroutines, l.goroutines)
	check(end.fds <= warm.fds+l.fds, "open files grew from %d after warm-up to %d (margin %d)", warm.fds, end.fds, l.fds)
	check(end.heap <= heapMax, "heap grew from %s after warm-up to %s (tolerance %s)", mib(warm.heap), mib(end.heap), mib(heapMax))
	bad = append(bad, l.afterShutdown(before, after)...)
	check(c.failed.Load() <= l.allowFailedCalls, "%d calls or streams failed unexpectedly", c.failed.Load())
	check(c.wrong.Load() <= l.allowWrongAnswers, "%d calls or streams got a wrong answer", c.wrong.Load())
	return bad
}

// afterShutdown compares the figures after shutdown with those before the
// start and returns one line per limit exceeded.
func (l limits) afterShutdown(before, after figures) []string {
	var bad []string
	if after.goroutines > before.goroutines+l.afterGoroutines {
		bad = append(bad, fmt.Sprintf("%d goroutines after shutdown, %d before the start (margin %d)", after.goroutines, before.goroutines, l.afterGoroutines))
	}
	if after.fds > before.fds+l.afterFDs {
		bad = append(bad, fmt.Sprintf("%d open files after shutdown, %d before the start (margin %d)", after.fds, before.fds, l.afterFDs))
	}
	if after.heap > before.heap+l.heapSlack {
		bad = append(bad, fmt.Sprintf("heap %s after shutdown, %s before the start (slack %s)", mib(after.heap), mib(before.heap), mib(l.heapSlack)))
	}
	return bad
}

func progress(w io.Writer, f figures, total time.Duration, c *counts) {
	fmt.Fprintf(w, "[%7s/%s] %s; calls and streams %d ok, %d expired or cancelled, %d ended by a fault, %d failed, %d wrong (%d streams); %d clients opened\n",
		f.at.Round(time.Second), total, f, c.ok.Load(), c.expected.Load(), c.faulted.Load(), c.failed.Load(), c.wrong.Load(), c.streams.Load(), c.opened.Load())
}

func report(w io.Writer, k int, before, warm, end, after figures, bad []string) {
	// The name column is as wide in the headings as in the rows, so that
	// each heading sits over its figures.
	const row = "%-26s %10v %12v %6v\n"
	fmt.Fprintf(w, "\n"+row, "", "goroutines", "heap", "fds")
	for _, r := range []struct {
		name string
		f    figures
	}{{"before start", before}, {fmt.Sprintf("start (max of first %d)", k), warm}, {fmt.Sprintf("end (min of last %d)", k), end}, {"after shutdown", after}} {
		fmt.Fprintf(w, row, r.name, r.f.goroutines, mib(r.f.heap), r.f.fds)
	}
	if len(bad) == 0 {
		fmt.Fprintln(w, "\nPASS: no figure grew beyond its margin")
		return
	}
	fmt.Fprintf(w, "\nFAIL:\n  %s\n", strings.Join(bad, "\n  "))
}
