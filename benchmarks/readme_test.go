package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The README's Run section says about how long each example takes: the
// same estimate the harness prints before a run (and -h in its examples)
// must agree with it, within the rounding of "about".
func TestReadmeRunTimesMatchTheEstimate(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the README's times are for Linux, where shm-ring runs by default and -floors adds its floors")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^\s+go run \./benchmarks([^#\n]*)#[^\n]*about ([0-9.]+) (minutes|s)$`)
	found := 0
	for _, m := range line.FindAllStringSubmatch(string(readme), -1) {
		found++
		args := strings.Fields(m[1])
		o, _, err := parseFlags(args, io.Discard)
		if err != nil {
			t.Errorf("README example %q: %v", m[1], err)
			continue
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		said := time.Duration(n * float64(time.Second))
		if m[3] == "minutes" {
			said = time.Duration(n * float64(time.Minute))
		}
		est := estimate(o.cells(), o)
		if o.codecs {
			est += 30 * time.Second // the codec table, as -codecs's help says
		}
		if r := float64(est) / float64(said); r < 0.7 || r > 1.3 {
			t.Errorf("README says %q takes about %s; the harness estimates %s", strings.TrimSpace(m[1]), said, est.Round(time.Second))
		}
	}
	if found < 4 {
		t.Errorf("found %d examples with a time in the README, want the Run section's", found)
	}
}

// The README links the newest full run (every mode, every default
// system) among the results files.
func TestReadmeNamesTheNewestFullRun(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("results", "*.md"))
	if err != nil || len(files) == 0 {
		t.Skipf("no results files (%v)", err)
	}
	slices.Sort(files) // named by UTC start time
	newest := ""
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, cmd, ok := strings.Cut(string(data), "- Command: `")
		if !ok {
			continue
		}
		cmd, _, _ = strings.Cut(cmd, "`")
		if !strings.Contains(cmd, "-mode") && !strings.Contains(cmd, "-systems") {
			newest = filepath.Base(f)
		}
	}
	if newest == "" {
		t.Skip("no full run among the results files")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "results/"+newest) {
		t.Errorf("README does not link results/%s, the newest full run", newest)
	}
}
