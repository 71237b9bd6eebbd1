package main

import (
	"regexp"
	"strconv"
	"strings"
)

// status is what go test's fuzzing output said so far about one target.
type status struct {
	Execs    int64  // executions, from the last progress line
	New      int    // new interesting inputs this run found
	Elapsed  string // as go test printed it
	Failed   bool   // go test printed a failure
	Crasher  string // where go test wrote the failing input, if it did
	Progress bool   // at least one progress line was seen
	// DeadlineRace: go test's one complaint was "context deadline
	// exceeded" under the failing target, no input written: Go's fuzzing
	// coordinator losing a race with its own -fuzztime (golang/go#75804,
	// fixed in Go 1.27), not a finding.
	DeadlineRace bool
	failLine     bool // the last line was "--- FAIL: ..."
}

// progressLine matches go test's periodic fuzzing line:
// "fuzz: elapsed: 3s, execs: 122530 (40835/sec), new interesting: 2 (total: 10)".
var progressLine = regexp.MustCompile(`^fuzz: elapsed: (\S+), execs: (\d+) \([^)]*\), new interesting: (\d+)`)

// crasherLine matches where go test saves an input that failed.
var crasherLine = regexp.MustCompile(`Failing input written to (\S+)`)

// observe updates s from one line of go test's output and reports whether
// it was a progress line.
func (s *status) observe(line string) bool {
	line = strings.TrimSpace(line)
	if m := progressLine.FindStringSubmatch(line); m != nil {
		s.Elapsed = m[1]
		s.Execs, _ = strconv.ParseInt(m[2], 10, 64)
		s.New, _ = strconv.Atoi(m[3])
		s.Progress = true
		return true
	}
	if m := crasherLine.FindStringSubmatch(line); m != nil {
		s.Crasher = m[1]
		s.Failed = true
	}
	if s.failLine && line == "context deadline exceeded" {
		s.DeadlineRace = true
	}
	s.failLine = strings.HasPrefix(line, "--- FAIL")
	if s.failLine || line == "FAIL" || strings.HasPrefix(line, "FAIL\t") {
		s.Failed = true
	}
	return false
}
