package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// A size whose byte count overflows int must be refused, not wrap into a
// small or negative payload that passes the 1 MiB check.
func TestParseSizeRefusesOverflow(t *testing.T) {
	for _, s := range []string{"17592186044416MiB", "17592186044417MiB", "9007199254740992KiB", "9999999999999999KiB"} {
		if v, err := parseSize(s); err == nil {
			t.Errorf("parseSize(%q) = %d, accepted", s, v)
		}
	}
	if _, _, err := parseFlags([]string{"-payloads=17592186044417MiB"}, io.Discard); err == nil {
		t.Errorf("-payloads=17592186044417MiB accepted")
	}
}

// A value given twice in a list flag (or twice under two spellings, 16
// and 16B) makes two identical cells, which share one entry of the
// results map: must be refused.
func TestListFlagsRefuseRepeats(t *testing.T) {
	for _, args := range [][]string{{"-clients=16,16"}, {"-payloads=16,16B"}, {"-callers=4,4"}, {"-many-payload=16,16"},
		{"-short-callers=1,1"}, {"-streams=1,1"}, {"-stream-sizes=64KiB,65536"}} {
		if o, _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted: cells %v", args, o.cells())
		}
	}
}

// A cell listed twice (options built without parseFlags) is refused:
// results are kept by cell, so its rounds would be added up twice.
func TestACellListedTwiceIsRefused(t *testing.T) {
	sys, err := lookupSystems([]string{"netrpc"})
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		duration: 100 * time.Millisecond, warmup: 10 * time.Millisecond, rounds: 1,
		modes: []string{modeMany}, clients: []int{1, 1}, clientCallers: 1, manyPayloads: []int{modePayload},
		systems: sys, progress: io.Discard,
	}
	if _, err := runWithin(t, 60*time.Second, o); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("runBenchmarks with clients 1,1: %v; want the cell refused as listed twice", err)
	}
}
