package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// A soak with three samples after its warm-up whose heap, goroutines and
// open files grow at every one must not pass: with the start taken as the
// highest of the first 3 and the end as the lowest of the last 3, both
// come from the same samples, and the end can never exceed the start.
func TestFewSamplesCannotHideGrowth(t *testing.T) {
	mb := uint64(1 << 20)
	steady := []figures{
		{goroutines: 50, heap: 10 * mb, fds: 20},
		{goroutines: 500, heap: 100 * mb, fds: 200},
		{goroutines: 5000, heap: 1000 * mb, fds: 2000}, // the last, taken after the traffic stopped
	}
	l := limits{goroutines: 16, fds: 8, heapRatio: 0.5, heapSlack: 8 * mb}
	start, end := startAndEnd(steady)
	var c counts
	if bad := l.verdict(figures{}, start, end, figures{}, &c); len(bad) == 0 {
		t.Errorf("goroutines 50→5000, heap 10→1000 MiB, fds 20→2000 pass: start %v, end %v", start, end)
	}
}

// Interrupting a soak before its -duration is not a pass: exit 0 and
// PASS would claim a soak that did not run.
func TestInterruptedSoakDoesNotPass(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"-duration", "1m", "-interval", "500ms", "-warmup", "0s", "-callers", "2", "-seed", "7",
		"-settle", "2s", "-heap-slack", "96"}, &out, &errOut)
	if code == 0 || strings.Contains(out.String(), "PASS") {
		t.Errorf("a soak interrupted after 1.5 s of its 1m: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
}
