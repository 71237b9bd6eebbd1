//go:build unix

package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// Ctrl-C stops the target being fuzzed at once. go test leaves an
// interrupt to the test binary, which gets it from the terminal with the
// rest of the foreground group; killing the go command alone orphans the
// test binary and its fuzzing workers, which keep fuzzing, and keep the
// output pipe open, until -time ends. The fake go here does as go test
// does: it waits out the interrupt for its child, a long sleep standing
// for the test binary.
func TestInterruptStopsGoTestAndItsChildren(t *testing.T) {
	fakeGo(t, `#!/bin/sh
trap ':' INT
echo "fuzz: elapsed: 0s, execs: 1 (1/sec), new interesting: 0 (total: 1)"
sleep 20
echo "FAIL"
exit 1
`)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel) // Ctrl-C
	cfg := &config{fuzzTime: time.Minute, minimizeTime: time.Second}
	start := time.Now()
	r := fuzz(ctx, t.TempDir(), target{Name: "FuzzX", Pkg: "./x"}, cfg, io.Discard)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("fuzz returned %s after Ctrl-C: go test's child ran on", took.Round(time.Second))
	}
	if r.passed() || r.Failed || !strings.Contains(r.verdict(), "interrupted") {
		t.Errorf("verdict %q (failed %v): want an interrupted run, neither ok nor FAIL", r.verdict(), r.Failed)
	}
}
