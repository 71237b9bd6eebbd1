package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A target whose failure prints a line longer than bufio.Scanner's 64 KiB
// (a t.Fatalf quoting a large input) stops the scan: the rest of go
// test's output, "Failing input written to ...", is never read, and a
// go test with more than a pipe's worth left blocks on its write, so
// cmd.Wait never returns.
func TestLongOutputLineDoesNotHangOrLoseTheCrasher(t *testing.T) {
	fakeGo(t, `#!/bin/sh
echo "fuzz: elapsed: 3s, execs: 100 (33/sec), new interesting: 1 (total: 2)"
echo "--- FAIL: FuzzX (3.00s)"
head -c 300000 /dev/zero | tr '\0' 'x'
echo
echo "    Failing input written to testdata/fuzz/FuzzX/abcdef"
echo "FAIL"
exit 1
`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &config{fuzzTime: time.Second, minimizeTime: time.Second}
	r := fuzz(ctx, t.TempDir(), target{Name: "FuzzX", Pkg: "./x"}, cfg, io.Discard)
	if ctx.Err() != nil {
		t.Fatalf("fuzz did not return until its context ended: %+v", r)
	}
	if r.passed() || r.Crasher != "testdata/fuzz/FuzzX/abcdef" || !strings.HasPrefix(r.verdict(), "FAIL: ") {
		t.Errorf("verdict %q, crasher %q: want FAIL naming the input written", r.verdict(), r.Crasher)
	}
}

// fakeGo puts a go command that runs script first on PATH, for the rest
// of t, skipping t where there is no /bin/sh to run it.
func fakeGo(t *testing.T, script string) {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh for a fake go command")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}
