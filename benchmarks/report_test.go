package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// oneCellRun is a finished run of one long-mode cell of kernrpc and
// grpc-go, with the rounds given per system, for tests of the report.
func oneCellRun(t *testing.T, roundQPS ...[]float64) *benchmark {
	t.Helper()
	sys, err := lookupSystems([]string{"kernrpc", "grpc"})
	if err != nil {
		t.Fatal(err)
	}
	c := cell{mode: modeLong, payload: 16, callers: 1}
	var rs []*result
	for _, qps := range roundQPS {
		var calls float64
		for _, q := range qps {
			calls += q // rounds of a second each
		}
		r := &result{calls: uint64(calls), elapsed: time.Second * time.Duration(len(qps)), roundQPS: qps,
			client: procStats{mallocs: uint64(calls), cpu: time.Second}, server: procStats{mallocs: 2 * uint64(calls), cpu: time.Second}}
		for range 1000 {
			r.hist.record(40 * time.Microsecond)
		}
		rs = append(rs, r)
	}
	return &benchmark{opts: options{systems: sys, modes: []string{modeLong}, rounds: len(roundQPS[0]), duration: time.Second},
		cells: []cell{c}, results: map[cell][]*result{c: rs}}
}

// With one round there is no spread between rounds: the ± column must not
// say ±0%, which reads as a figure free of noise, where the README says a
// difference below it is noise.
func TestOneRoundHasNoSpread(t *testing.T) {
	md := oneCellRun(t, []float64{20000}, []float64{10000}).markdown("go test")
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| 1 ") && strings.Contains(line, "±0%") {
			t.Errorf("one round, yet the spread is given as 0%%: %s", line)
		}
	}
	if !strings.Contains(md, "±n/a") {
		t.Errorf("report lacks ±n/a for cells of one round:\n%s", md)
	}
	// Two rounds of 21k and 19k calls/s: ±5% of 20k.
	md = oneCellRun(t, []float64{21000, 19000}, []float64{10000, 10000}).markdown("go test")
	if !strings.Contains(md, "20.0k ±5% ·") || !strings.Contains(md, "10.0k ±0% ·") {
		t.Errorf("two rounds: want ±5%% and ±0%%:\n%s", md)
	}
}

// kernrpc takes no GC headroom in a process whose GOGC or GOMEMLIMIT is
// set, and every process of a run inherits the harness's environment: the
// header must not then say that kernrpc's processes, and the peers' clients
// beside them, keep 64 MiB in reserve.
func TestHeadroomNoteFollowsTheEnvironment(t *testing.T) {
	const kept = "kernrpc's defaults keep 64 MiB of heap in reserve"
	for _, c := range []struct {
		gogc, memlimit string
		keeps          bool
	}{
		{"", "", true},
		{"100", "off", true}, // the runtime's defaults
		{"400", "", false},
		{"off", "", false},
		{"", "1GiB", false},
	} {
		t.Setenv("GOGC", c.gogc)
		t.Setenv("GOMEMLIMIT", c.memlimit)
		md := oneCellRun(t, []float64{20000}, []float64{10000}).markdown("go test")
		if got := strings.Contains(md, kept); got != c.keeps {
			t.Errorf("GOGC=%q GOMEMLIMIT=%q: header says kernrpc keeps its headroom: %v, want %v", c.gogc, c.memlimit, got, c.keeps)
		}
		if !c.keeps && !strings.Contains(md, "- GC headroom: none") {
			t.Errorf("GOGC=%q GOMEMLIMIT=%q: header does not say no process keeps GC headroom", c.gogc, c.memlimit)
		}
	}
}

// In the many mode every client runs in a process of its own, so the
// peers' and floors' clients never run with kernrpc's reserve there: the
// header must not say they do, as it rightly does of the harness process
// in the other modes.
func TestHeadroomNoteInTheManyMode(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	const shared = "the peers' and floors' clients run with it too"
	b := oneCellRun(t, []float64{20000}, []float64{10000})
	for _, c := range []struct {
		modes            []string
		shared, separate bool
	}{
		{[]string{modeLong}, true, false},
		{[]string{modeMany}, false, true},
		{[]string{modeLong, modeMany}, true, true},
	} {
		b.opts.modes = c.modes
		md := b.markdown("go test")
		note := lineWith(md, "- GC headroom:")
		if got := strings.Contains(note, shared); got != c.shared {
			t.Errorf("modes %v: header says the peers' clients share kernrpc's reserve: %v, want %v:\n%s", c.modes, got, c.shared, note)
		}
		if got := strings.Contains(note, "the peers' and floors' client processes do not"); got != c.separate {
			t.Errorf("modes %v: header says the many mode's peer client processes keep none: %v, want %v:\n%s", c.modes, got, c.separate, note)
		}
	}
}

// Without /proc/stat the harness cannot tell what other processes took:
// the header must say so, not report 0% and a quiet machine. A round that
// could not tell leaves its cell's figure unknown, whatever the others.
func TestOtherProcessesNotMeasured(t *testing.T) {
	b := oneCellRun(t, []float64{20000}, []float64{10000})
	c := b.cells[0]
	var r result
	r.add(&roundResult{elapsed: time.Second, others: 20 * time.Millisecond})
	r.add(&roundResult{elapsed: time.Second, others: -1}) // othersUnknown
	r.add(&roundResult{elapsed: time.Second, others: 30 * time.Millisecond})
	if r.others >= 0 {
		t.Errorf("a round without /proc/stat added up to %s of other processes' CPU, want it unknown", r.others)
	}
	for _, res := range b.results[c] {
		res.others = r.others
	}
	note := lineWith(b.markdown("go test"), "- Other processes:")
	if !strings.Contains(note, "not measured") || strings.Contains(note, "quiet enough") || strings.Contains(note, "%") {
		t.Errorf("header without /proc/stat: %q, want it to say the other processes were not measured", note)
	}
	for _, res := range b.results[c] {
		res.others = 20 * time.Millisecond
	}
	want := fmt.Sprintf("%.0f%% of the CPUs", 100*othersShare(20*time.Millisecond, time.Second))
	if note := lineWith(b.markdown("go test"), "- Other processes:"); !strings.Contains(note, want) || !strings.Contains(note, "quiet enough") {
		t.Errorf("header with /proc/stat: %q", note)
	}
}
