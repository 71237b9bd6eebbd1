// Command kernrpc-fuzz runs every fuzz target of the repository, one
// after another, each for a given time, and prints a table of what each
// did. The default test run only replays the seeds and corpora; this is
// how the targets are given time to search.
//
//	go run ./cmd/kernrpc-fuzz -time 30s [-run pattern]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"
)

const usage = `Usage: kernrpc-fuzz [-time D] [-minimize D] [-run REGEXP] [-list]

Runs each fuzz target of the kernrpc repository for -time, one at a time,
with "go test -run '^$' -fuzz '^Target$' -fuzztime D -fuzzminimizetime M
./pkg" from the repository root, prints a progress line per target every
10 s, and a table at the end: target, package, time, executions, new
corpus entries (new interesting inputs, kept in the Go build cache) and
the result. An input that fails is written by go test to the package's
testdata/fuzz/<Target>/; commit it with the fix, and it becomes a
regression test of the default run. Ctrl-C stops the target being fuzzed,
go test's children with it, and prints the table so far. Exits 1 if any
target failed or was interrupted. Before Go 1.27, go test may fail a
target with only "context deadline exceeded" as its -fuzztime ends
(golang/go#75804): with no input written, that is reported as ok, saying
so.

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	fuzzTime     time.Duration
	minimizeTime time.Duration
	pattern      *regexp.Regexp
	list         bool
}

// errBadFlag is a flag that did not parse, already reported with the
// usage by the flag package.
var errBadFlag = errors.New("bad flag")

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("kernrpc-fuzz", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	d := fs.Duration("time", 30*time.Second, "how long to fuzz each target")
	// go test's own 60s left FuzzParseDescriptorSet, whose inputs are
	// kilobytes, at 10 executions in a 15s run (docs/reliability.md).
	m := fs.Duration("minimize", 5*time.Second, "how long go test may shrink each new interesting or failing input (-fuzzminimizetime)")
	run := fs.String("run", "", "only the targets whose name or package matches this regexp")
	list := fs.Bool("list", false, "print the targets and exit")
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
	if *d <= 0 {
		return nil, fmt.Errorf("-time %s: want a positive duration", *d)
	}
	if *m <= 0 {
		return nil, fmt.Errorf("-minimize %s: want a positive duration", *m)
	}
	re, err := regexp.Compile(*run)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	return &config{fuzzTime: *d, minimizeTime: *m, pattern: re, list: *list}, nil
}

// selected returns the targets whose name or package matches re.
func selected(re *regexp.Regexp) []target {
	var out []target
	for _, t := range targets {
		if re.MatchString(t.Name) || re.MatchString(t.Pkg) {
			out = append(out, t)
		}
	}
	return out
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errBadFlag) {
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "kernrpc-fuzz:", err)
		return 2
	}
	todo := selected(cfg.pattern)
	if len(todo) == 0 {
		fmt.Fprintf(stderr, "kernrpc-fuzz: no target matches -run %q\n", cfg.pattern)
		return 2
	}
	if cfg.list {
		for _, t := range todo {
			fmt.Fprintf(stdout, "%s\t%s\n", t.Name, t.Pkg)
		}
		return 0
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(stderr, "kernrpc-fuzz:", err)
		return 1
	}
	results := make([]result, 0, len(todo))
	for i, t := range todo {
		fmt.Fprintf(stdout, "[%d/%d] %s %s: fuzzing for %s\n", i+1, len(todo), t.Name, t.Pkg, cfg.fuzzTime)
		r := fuzz(ctx, root, t, cfg, stdout)
		fmt.Fprintf(stdout, "[%d/%d] %s %s: %s after %d executions, %d new\n", i+1, len(todo), t.Name, t.Pkg, r.verdict(), r.Execs, r.New)
		results = append(results, r)
		if ctx.Err() != nil {
			break
		}
	}
	printTable(stdout, results)
	for _, r := range results {
		if !r.passed() {
			return 1
		}
	}
	return 0
}

// repoRoot is the directory of the go.work or go.mod the go command
// finds from here: the package paths in targets are relative to it.
func repoRoot() (string, error) {
	for _, v := range []string{"GOWORK", "GOMOD"} {
		out, err := exec.Command("go", "env", v).Output()
		if err != nil {
			return "", fmt.Errorf("go env %s: %w", v, err)
		}
		if p := strings.TrimSpace(string(out)); p != "" && p != "off" && p != os.DevNull {
			return filepath.Dir(p), nil
		}
	}
	return "", errors.New("not inside a Go module: run kernrpc-fuzz from the kernrpc repository")
}

// result is one target's run.
type result struct {
	target
	status
	Took time.Duration
	Err  error // go test could not run, or was interrupted
}

func (r result) verdict() string {
	switch {
	case r.Failed && r.Crasher != "":
		return "FAIL: " + r.Crasher
	case r.Failed && r.DeadlineRace:
		return okRace
	case r.Failed:
		return "FAIL"
	case r.Err != nil:
		return "error: " + r.Err.Error()
	}
	return "ok"
}

// okRace is the verdict of a run that go test failed only by racing its own
// -fuzztime (status.DeadlineRace): the target was fuzzed for its time and
// no input failed.
const okRace = "ok (go test's fuzztime race, golang/go#75804: no input failed)"

// passed reports whether r found nothing: ok, or ok but for the race.
func (r result) passed() bool { v := r.verdict(); return v == "ok" || v == okRace }

// goTestArgs are the arguments of the go command that fuzzes t.
func goTestArgs(t target, cfg *config) []string {
	return []string{"test", "-run", "^$", "-fuzz", "^" + t.Name + "$",
		"-fuzztime", cfg.fuzzTime.String(), "-fuzzminimizetime", cfg.minimizeTime.String(), t.Pkg}
}

// fuzz runs go test on one target, printing its latest progress every
// 10 s and, when it fails, go test's own output.
func fuzz(ctx context.Context, root string, t target, cfg *config, stdout io.Writer) result {
	start := time.Now()
	r := result{target: t}
	cmd := exec.CommandContext(ctx, "go", goTestArgs(t, cfg)...)
	cmd.Dir = root
	// Ctrl-C reaches go test's children too, not only go test.
	release := ownGroup(cmd, 10*time.Second)
	defer release()
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.Err = err
		return r
	}
	cmd.Stderr = cmd.Stdout // one stream: a build error must reach the log too
	if err := cmd.Start(); err != nil {
		r.Err = fmt.Errorf("go test: %w", err)
		return r
	}
	var log []string
	last := time.Now()
	// Lines of any length: a bufio.Scanner stops at its first line over
	// 64 KiB (a failure quoting a large input), leaving the rest unread,
	// "Failing input written to" with it, and go test blocked writing it.
	rd := bufio.NewReader(out)
	for {
		line, rerr := rd.ReadString('\n')
		if rerr != nil && line == "" {
			break
		}
		line = strings.TrimRight(line, "\r\n")
		if !r.observe(line) {
			log = append(log, line)
		} else if time.Since(last) >= 10*time.Second {
			last = time.Now()
			fmt.Fprintf(stdout, "    %s: %s, %d executions, %d new\n", t.Name, r.Elapsed, r.Execs, r.New)
		}
	}
	if err := cmd.Wait(); err != nil {
		r.Failed = r.Failed || ctx.Err() == nil
		r.Err = fmt.Errorf("go test: %w", err)
	}
	if ctx.Err() != nil && r.Crasher == "" {
		// go test's FAIL after Ctrl-C is the interrupt's, not a finding.
		r.Failed, r.Err = false, errors.New("interrupted")
	}
	if r.Failed {
		fmt.Fprintln(stdout, strings.Join(log, "\n"))
	}
	r.Took = time.Since(start).Round(time.Second)
	return r
}

func printTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tPACKAGE\tTIME\tEXECUTIONS\tNEW\tRESULT")
	var execs int64
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", r.Name, r.Pkg, r.Took, r.Execs, r.New, r.verdict())
		execs += r.Execs
	}
	fmt.Fprintf(tw, "total\t\t\t%d\t\t\n", execs)
	tw.Flush()
}
