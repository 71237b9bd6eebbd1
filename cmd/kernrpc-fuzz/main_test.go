package main

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestTargetsAreEveryFuzzFunction keeps the fixed list true: every func
// Fuzz in the repository's test files is listed with its package, and
// nothing else is.
func TestTargetsAreEveryFuzzFunction(t *testing.T) {
	root := filepath.Join("..", "..")
	decl := regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)
	var found []target
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := "./" + filepath.ToSlash(rel)
		if rel == "." {
			pkg = "."
		}
		for _, m := range decl.FindAllSubmatch(src, -1) {
			found = append(found, target{Name: string(m[1]), Pkg: pkg})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	key := func(t target) string { return t.Pkg + " " + t.Name }
	want, have := sortedKeys(found, key), sortedKeys(targets, key)
	if !slices.Equal(want, have) {
		t.Fatalf("targets.go lists\n  %s\nthe repository has\n  %s", strings.Join(have, "\n  "), strings.Join(want, "\n  "))
	}
	if len(want) < 12 {
		t.Fatalf("found only %d fuzz functions; is the walk starting at the repository root?", len(want))
	}
}

func sortedKeys(ts []target, key func(target) string) []string {
	var out []string
	for _, t := range ts {
		out = append(out, key(t))
	}
	slices.Sort(out)
	return out
}

func TestObserveReadsGoTestsFuzzOutput(t *testing.T) {
	var s status
	for _, line := range []string{
		"fuzz: elapsed: 0s, gathering baseline coverage: 0/54 completed",
		"fuzz: elapsed: 3s, execs: 8496 (2831/sec), new interesting: 9 (total: 63)",
		"fuzz: elapsed: 21s, execs: 52381 (539/sec), new interesting: 31 (total: 85)",
		"PASS",
	} {
		s.observe(line)
	}
	if s.Execs != 52381 || s.New != 31 || s.Elapsed != "21s" || s.Failed || !s.Progress {
		t.Fatalf("after a passing run: %+v", s)
	}
	for _, line := range []string{
		"--- FAIL: FuzzDecodeFrame (0.52s)",
		"    Failing input written to testdata/fuzz/FuzzDecodeFrame/582528ddfad69eb5",
		"FAIL",
		"exit status 1",
	} {
		s.observe(line)
	}
	if !s.Failed || s.Crasher != "testdata/fuzz/FuzzDecodeFrame/582528ddfad69eb5" || s.Execs != 52381 || s.DeadlineRace {
		t.Fatalf("after a failing run: %+v", s)
	}
}

// Go before 1.27 can fail a target as its -fuzztime ends with only the
// coordinator's own "context deadline exceeded" (golang/go#75804, as seen
// here): no input failed, and the run is reported ok, saying so. A target
// whose own failure says the same words writes an input, and fails.
func TestGoTestsOwnDeadlineRaceIsNotAFinding(t *testing.T) {
	race := []string{
		"fuzz: elapsed: 21s, execs: 346581 (0/sec), new interesting: 14 (total: 300)",
		"--- FAIL: FuzzDecodeOptions (20.44s)",
		"    context deadline exceeded",
		"FAIL",
		"exit status 1",
		"FAIL\tgithub.com/kernrpc/kernrpc/kernel\t20.465s",
	}
	var s status
	for _, line := range race {
		s.observe(line)
	}
	r := result{status: s}
	if !s.DeadlineRace || !r.passed() || r.verdict() != okRace {
		t.Fatalf("the deadline race: %+v, verdict %q", s, r.verdict())
	}

	s = status{}
	for _, line := range []string{
		"--- FAIL: FuzzDecodeOptions (0.31s)",
		"    --- FAIL: FuzzDecodeOptions (0.00s)",
		"        context deadline exceeded",
		"    Failing input written to testdata/fuzz/FuzzDecodeOptions/0123abcd",
		"FAIL",
	} {
		s.observe(line)
	}
	if r := (result{status: s}); r.passed() {
		t.Fatalf("a target that failed with an input written passed: %+v, verdict %q", s, r.verdict())
	}

	s = status{}
	for _, line := range []string{"--- FAIL: FuzzX (1.00s)", "    x_test.go:12: decoded 3, want 4", "FAIL"} {
		s.observe(line)
	}
	if r := (result{status: s}); r.passed() || s.DeadlineRace {
		t.Fatalf("a failure of another kind passed: %+v, verdict %q", s, r.verdict())
	}
}

func TestFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "Usage: kernrpc-fuzz") {
		t.Fatalf("-h: exit %d, %q", code, errOut.String())
	}
	for _, bad := range [][]string{{"-time", "0s"}, {"-minimize", "-1s"}, {"-run", "("}, {"-run", "NoSuchTarget"}, {"extra"}} {
		errOut.Reset()
		if code := run(t.Context(), bad, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2; %s", bad, code, errOut.String())
		}
	}
	out.Reset()
	if code := run(t.Context(), []string{"-list", "-run", "codec/json|Metadata$"}, &out, &errOut); code != 0 {
		t.Fatalf("-list: exit %d: %s", code, errOut.String())
	}
	if got, want := out.String(), "FuzzDecodeMetadata\t./kernel\nFuzzUnmarshal\t./plugins/codec/json\n"; got != want {
		t.Fatalf("-list -run: %q, want %q", got, want)
	}
}

// A flag that does not parse is reported once, by the flag package, with
// the usage: not a second time as kernrpc-fuzz's own error.
func TestBadFlagIsReportedOnce(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"-nope"}, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if n := strings.Count(errOut.String(), "flag provided but not defined: -nope"); n != 1 {
		t.Fatalf("the error is printed %d times, want once:\n%s", n, errOut.String())
	}
	if !strings.Contains(errOut.String(), "Usage: kernrpc-fuzz") {
		t.Fatalf("no usage:\n%s", errOut.String())
	}
}

// -time and -minimize reach go test as -fuzztime and -fuzzminimizetime.
func TestGoTestGetsTheDurations(t *testing.T) {
	cfg, err := parseFlags([]string{"-time", "15s", "-minimize", "2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(goTestArgs(target{Name: "FuzzX", Pkg: "./pkg"}, cfg), " ")
	if want := "test -run ^$ -fuzz ^FuzzX$ -fuzztime 15s -fuzzminimizetime 2s ./pkg"; got != want {
		t.Fatalf("go %s; want go %s", got, want)
	}
	if cfg, _ := parseFlags(nil, io.Discard); cfg.minimizeTime != 5*time.Second {
		t.Fatalf("-minimize defaults to %s; want 5s", cfg.minimizeTime)
	}
}

func TestTableNamesEveryTargetAndTheTotal(t *testing.T) {
	var out bytes.Buffer
	printTable(&out, []result{
		{target: targets[0], status: status{Execs: 100, New: 2}},
		{target: targets[1], status: status{Execs: 50, Failed: true, Crasher: "testdata/fuzz/x/y"}},
	})
	for _, want := range []string{"TARGET", targets[0].Name, "100", "ok", "FAIL: testdata/fuzz/x/y", "total", "150"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// A real run of one target: go test -fuzz in the target's package, a
// progress line per target, then the table, exit 0 when nothing failed.
func TestRunFuzzesATargetAndReports(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and fuzzes a package")
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"-run", "^FuzzReadFrameLength$", "-time", "1s"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	// A 1s run on a busy machine can end in go test's own fuzztime race
	// (it did in CI): ok either way, saying which.
	verdict := " ok"
	if strings.Contains(out.String(), okRace) {
		verdict = " " + okRace
	}
	for _, want := range []string{
		"[1/1] FuzzReadFrameLength ./kernel: fuzzing for 1s\n",
		"[1/1] FuzzReadFrameLength ./kernel:" + verdict + " after ",
		"TARGET", "FuzzReadFrameLength  ./kernel", verdict + "\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
