package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestShortSoakPassesAndPrintsTheFigures runs the real traffic for 3 s.
// Its 2 s settle is shorter than the 30 s the engine keeps its GC headroom
// (gc_headroom, 64 MiB) after the last client closes, so the heap slack
// after shutdown allows for it.
func TestShortSoakPassesAndPrintsTheFigures(t *testing.T) {
	var out, errOut bytes.Buffer
	profile := filepath.Join(t.TempDir(), "heap.pprof")
	code := run(t.Context(), []string{"-duration", "3s", "-interval", "1s", "-warmup", "1s", "-callers", "4", "-seed", "7", "-heapprofile", profile,
		"-settle", "2s", "-heap-slack", "96"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"before start", "start (max of first ", "end (min of last ", "after shutdown", "goroutines", "heap", "fds", "PASS", "[     1s/3s]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if st, err := os.Stat(profile); err != nil || st.Size() == 0 {
		t.Errorf("-heapprofile wrote no profile: %v", err)
	}
	if strings.Contains(out.String(), " 0 ok,") {
		t.Errorf("some progress line counts no successful call:\n%s", out.String())
	}
}

func TestVerdictNamesEveryFigureThatGrew(t *testing.T) {
	l := limits{goroutines: 10, fds: 5, heapRatio: 0.5, heapSlack: 1 << 20, afterGoroutines: 2, afterFDs: 1}
	before := figures{goroutines: 3, fds: 10, heap: 1 << 20}
	warm := figures{goroutines: 50, fds: 20, heap: 20 << 20}
	var c counts
	if bad := l.verdict(before, warm, warm, before, &c); len(bad) != 0 {
		t.Fatalf("unchanged figures: %q", bad)
	}
	end := figures{goroutines: 61, fds: 26, heap: 32 << 20}
	after := figures{goroutines: 6, fds: 12, heap: 18 << 20}
	c.failed.Add(1)
	c.wrong.Add(2)
	bad := strings.Join(l.verdict(before, warm, end, after, &c), "\n")
	for _, want := range []string{"goroutines grew from 50", "open files grew from 20", "heap grew from 20.0 MiB", "6 goroutines after shutdown",
		"12 open files after shutdown", "heap 18.0 MiB after shutdown, 1.0 MiB before the start (slack 1.0 MiB)", "1 calls or streams failed", "2 calls or streams got a wrong answer"} {
		if !strings.Contains(bad, want) {
			t.Errorf("verdict lacks %q:\n%s", want, bad)
		}
	}
}

func TestFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "Usage: kernrpc-soak") {
		t.Fatalf("-h: exit %d: %s", code, errOut.String())
	}
	for _, bad := range [][]string{{"-duration", "0s"}, {"-callers", "0"}, {"-settle", "0s"}, {"extra"}, {"-nope"}} {
		if code := run(t.Context(), bad, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", bad, code)
		}
	}
}

// A negative margin is refused, not run: a negative -heap-slack wrapped to
// an allowance of some 16 EiB and passed any heap growth.
func TestNegativeMarginsAreRefused(t *testing.T) {
	for _, bad := range [][]string{{"-heap-slack", "-1"}, {"-heap-tolerance", "-0.5"}, {"-goroutine-margin", "-1"}, {"-fd-margin", "-1"}, {"-warmup", "-1s"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("%q: error %v, want one saying it must not be negative", bad, err)
		}
	}
}

// A flag that does not parse is reported once, by the flag package, with
// the usage: not a second time as kernrpc-soak's own error.
func TestBadFlagIsReportedOnce(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"-nope"}, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if n := strings.Count(errOut.String(), "flag provided but not defined: -nope"); n != 1 {
		t.Fatalf("the error is printed %d times, want once:\n%s", n, errOut.String())
	}
	if !strings.Contains(errOut.String(), "Usage: kernrpc-soak") {
		t.Fatalf("no usage:\n%s", errOut.String())
	}
}

func TestStartIsTheEarlyPeakAndEndTheLateFloor(t *testing.T) {
	mb := uint64(1 << 20)
	steady := []figures{{goroutines: 50, heap: 30 * mb, fds: 20}, {goroutines: 55, heap: 80 * mb, fds: 22}, {goroutines: 52, heap: 40 * mb, fds: 21},
		{goroutines: 60, heap: 90 * mb, fds: 30}, {goroutines: 58, heap: 25 * mb, fds: 26}, {goroutines: 57, heap: 70 * mb, fds: 28}}
	start, end := startAndEnd(steady)
	if start.goroutines != 55 || start.heap != 80*mb || start.fds != 22 {
		t.Errorf("start %v, want the highest of the first 3: goroutines 55, heap 80 MiB, fds 22", start)
	}
	if end.goroutines != 57 || end.heap != 25*mb || end.fds != 26 {
		t.Errorf("end %v, want the lowest of the last 3: goroutines 57, heap 25 MiB, fds 26", end)
	}
	if s, e := startAndEnd(steady[:1]); s != steady[0] || e != steady[0] {
		t.Errorf("one sample: %v, %v", s, e)
	}
}

func TestFaultLogsHidesTheFaultyServicesWarnings(t *testing.T) {
	var out bytes.Buffer
	logs := newFaultLogs(slog.NewTextHandler(&out, nil))
	faulty := slog.New(logs).With("component", "kernrpc.server", "service", serviceOf(faultyTCP))
	clean := slog.New(logs).With("service", serviceOf("tcp-lv"))
	faulty.Warn("dropping a duplicated request")
	faulty.WithGroup("conn").Info("connection reset")
	faulty.Error("handler panicked")
	clean.Warn("slow consumer")
	got := out.String()
	for _, want := range []string{"handler panicked", "slow consumer"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, hidden := range []string{"duplicated", "reset"} {
		if strings.Contains(got, hidden) {
			t.Errorf("output shows the faulty service's %q line:\n%s", hidden, got)
		}
	}
	if n := logs.hidden.Load(); n != 2 {
		t.Errorf("%d lines counted as hidden; want 2", n)
	}
}

// -heap-tolerance NaN or Inf is refused, not run: either turned the heap
// limit into a conversion of a non-finite float to uint64, which passed
// any heap growth (NaN is not below 0, so the negative check let it by).
func TestNonFiniteHeapToleranceIsRefused(t *testing.T) {
	for _, bad := range []string{"NaN", "+Inf", "Inf"} {
		if _, err := parseFlags([]string{"-heap-tolerance", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "-heap-tolerance") {
			t.Errorf("-heap-tolerance %s: error %v, want one naming -heap-tolerance", bad, err)
		}
	}
}

// A -heapprofile that cannot be written is refused before the traffic
// starts: found after -duration, it cost the whole soak its verdict.
func TestUnwritableHeapProfileIsRefusedAtOnce(t *testing.T) {
	var out, errOut bytes.Buffer
	profile := filepath.Join(t.TempDir(), "no such dir", "heap.pprof")
	code := run(t.Context(), []string{"-duration", "2s", "-interval", "500ms", "-warmup", "0s", "-callers", "1", "-settle", "1s", "-heapprofile", profile}, &out, &errOut)
	if code != 2 || strings.Contains(out.String(), "soak for") || !strings.Contains(errOut.String(), "-heapprofile") {
		t.Errorf("exit %d; want 2 with an error naming -heapprofile, before any traffic\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
}
