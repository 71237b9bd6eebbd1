package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
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

// Interrupting a soak while it waits after shutdown for the figures to
// come back ends that wait and gives no verdict, as an interrupt before
// does: the wait ignored Ctrl-C for up to -settle, then printed PASS or
// FAIL for a soak the user had stopped.
func TestInterruptWhileSettlingGivesNoVerdict(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &syncbuf.CancelOn{At: "shut down; waiting", Cancel: cancel}
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		// No slack at all: the heap the engine keeps after shutdown (its GC
		// headroom stays 30 s) holds the wait to its full -settle.
		done <- run(ctx, []string{"-duration", "1s", "-interval", "250ms", "-warmup", "0s", "-callers", "2", "-seed", "7",
			"-settle", "1m", "-heap-slack", "0", "-goroutine-margin", "0", "-fd-margin", "0"}, out, &errOut)
	}()
	var code int
	select {
	case code = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the soak still waits 20 s after an interrupt during its settle\nstdout:\n%s", out)
	}
	if code == 0 || strings.Contains(out.String(), "PASS") || strings.Contains(out.String(), "FAIL") || !strings.Contains(errOut.String(), "interrupted") {
		t.Errorf("a soak interrupted while settling: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut.String())
	}
}
