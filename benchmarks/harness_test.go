package main

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestMain lets the test binary play the server child: the harness
// re-executes os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	if isServe(os.Args[1:]) {
		os.Exit(serveMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestTinyRunGivesSaneNumbers runs the whole harness at the smallest scale,
// every built-in system in its own child process, and checks that every
// number in the table was measured and is plausible.
func TestTinyRunGivesSaneNumbers(t *testing.T) {
	var names []string
	for name := range systems {
		names = append(names, name)
	}
	sys, err := lookupSystems(names)
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		duration: 200 * time.Millisecond, warmup: 50 * time.Millisecond, rounds: 1,
		payloads: []int{16}, callers: []int{1}, systems: sys, progress: io.Discard,
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := runBenchmarks(ctx, exe, o)
	if err != nil {
		t.Fatalf("runBenchmarks: %v", err)
	}
	if left := liveChildren(t); len(left) > 0 {
		t.Errorf("server processes still running after the run: pids %v", left)
	}

	for i, r := range b.results[cell{payload: 16, callers: 1}] {
		name := sys[i].label
		p50, p99 := r.hist.quantile(0.5), r.hist.quantile(0.99)
		switch {
		case r.calls == 0 || r.qps() <= 0:
			t.Errorf("%s: no calls measured", name)
		case p50 <= 0 || p99 < p50 || r.hist.mean() <= 0:
			t.Errorf("%s: latencies not sane: mean %s p50 %s p99 %s", name, r.hist.mean(), p50, p99)
		case (r.client.mallocs == 0 && floorOf[sys[i].name] == "") || r.server.mallocs == 0:
			// Every system allocates something over hundreds of calls (at
			// least its connection's buffers on the server), so zero means
			// the counters were not read; only a bare ping-pong's caller
			// allocates nothing at all.
			t.Errorf("%s: allocations not measured: client %d server %d", name, r.client.mallocs, r.server.mallocs)
		case r.client.cpu <= 0 || r.server.cpu <= 0:
			t.Errorf("%s: CPU time not measured: client %s server %s", name, r.client.cpu, r.server.cpu)
		}
	}

	md := b.markdown("go test")
	for _, want := range append(labels(sys), "## 16 B payload", "| callers", "allocs", "µs") {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	// Each floor is compared with kernrpc over its own transport, and only
	// with that; nothing divides by a floor's near-zero allocations.
	for _, want := range []string{"## kernrpc / grpc-go", "## kernrpc / bare TCP", "## kernrpc/shm-ring / bare shm-ring"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks the %q ratios:\n%s", want, md)
		}
	}
	if strings.Contains(md, "## kernrpc / bare shm-ring") {
		t.Errorf("report compares kernrpc over tcp-lv with the bare shm-ring ping-pong:\n%s", md)
	}
	_, floorRatios, _ := strings.Cut(md, "## kernrpc / bare TCP")
	if !strings.Contains(floorRatios, "n/a") {
		t.Errorf("allocation ratio against a bare ping-pong is not n/a:\n%s", floorRatios)
	}
}

// liveChildren lists this process's children that have not exited.
func liveChildren(t *testing.T) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	if stats == nil {
		t.Log("no /proc: cannot check for leftover server processes")
		return nil
	}
	var pids []int
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces, so cut at ")".
		_, rest, _ := strings.Cut(string(data), ") ")
		f := strings.Fields(rest)
		if len(f) < 2 || f[0] == "Z" || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		pids = append(pids, pid)
	}
	return pids
}

func TestHistogramQuantilesWithinResolution(t *testing.T) {
	var h histogram
	var vals []time.Duration
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		// Log-uniform from 50 ns to 50 ms, the span calls cover.
		v := time.Duration(50 * math.Pow(1e6, r.Float64()))
		vals = append(vals, v)
		h.record(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		want := vals[int(q*float64(len(vals)))-1]
		got := h.quantile(q)
		if rel := float64(got-want) / float64(want); rel > 1.0/64 || rel < -1.0/64 {
			t.Errorf("quantile(%v) = %s, want %s within 1/64 (off by %.2f%%)", q, got, want, 100*rel)
		}
	}
	if h.n != uint64(len(vals)) || h.quantile(1) != vals[len(vals)-1] {
		t.Errorf("count %d max %s, want %d and %s", h.n, h.quantile(1), len(vals), vals[len(vals)-1])
	}
}

func TestBucketsAreContiguous(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<20; v++ {
		b := bucketOf(v)
		if b != prev && b != prev+1 {
			t.Fatalf("bucketOf(%d) = %d after %d: buckets skip", v, b, prev)
		}
		if mid := bucketMid(b); bucketOf(mid) != b {
			t.Fatalf("bucketMid(%d) = %d lies in bucket %d", b, mid, bucketOf(mid))
		}
		prev = b
	}
	if got := bucketOf(1 << 62); got >= histBuckets {
		t.Fatalf("bucketOf(huge) = %d, beyond the %d buckets", got, histBuckets)
	}
}

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		check   func(options) bool
	}{
		{"defaults are the documented matrix", nil, "", func(o options) bool {
			return slices.Equal(o.payloads, []int{16, 64 << 10}) && slices.Equal(o.callers, []int{1, 4, 64}) &&
				o.rounds == 3 && o.duration == 2*time.Second && o.warmup == 300*time.Millisecond && o.server.aliasRequests
		}},
		{"sizes take units", []string{"-payloads=0, 512B,1MiB"}, "", func(o options) bool {
			return slices.Equal(o.payloads, []int{0, 512, 1 << 20})
		}},
		{"systems keep the table order", []string{"-systems=netrpc,grpc"}, "", func(o options) bool {
			return len(o.systems) == 2 && o.systems[0].name == "grpc" && o.systems[1].name == "netrpc"
		}},
		{"floors add the bare ping-pongs after the frameworks", []string{"-systems=grpc", "-floors"}, "", func(o options) bool {
			names := make([]string, len(o.systems))
			for i, s := range o.systems {
				names[i] = s.name
			}
			return slices.Equal(names, append([]string{"grpc"}, floorSystems...))
		}},
		{"alias-requests is on unless turned off", []string{"-alias-requests=false"}, "", func(o options) bool {
			return !o.server.aliasRequests
		}},
		{"unknown system is named", []string{"-systems=thrift"}, `unknown system "thrift"`, nil},
		{"oversized payload says the limit", []string{"-payloads=8MiB"}, "over 1 MiB", nil},
		{"zero callers rejected", []string{"-callers=0"}, "bad callers count", nil},
		{"stray argument rejected", []string{"grpc"}, "unexpected argument", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, _, err := parseFlags(c.args, io.Discard)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(o) {
				t.Errorf("options %+v", o)
			}
		})
	}
}

// TestMeasuringAllocatesNothing guards the claim behind the allocation
// columns: between the two client snapshots, the harness's own work per
// call (clock, histogram, phase check) and the snapshots themselves
// allocate nothing, so every allocation counted is the framework's.
func TestMeasuringAllocatesNothing(t *testing.T) {
	var phase atomic.Int32
	h := new(histogram)
	calls := 0
	call := func(context.Context) (int, error) {
		if calls++; calls%1000 == 0 {
			phase.Store(phaseStop)
		}
		return 16, nil
	}
	ctx := context.Background()
	perRun := testing.AllocsPerRun(10, func() {
		phase.Store(phaseMeasure)
		if err := callLoop(ctx, call, 16, &phase, h); err != nil {
			t.Fatal(err)
		}
	})
	if perRun != 0 {
		t.Errorf("callLoop allocated %.1f times per 1000 calls, want 0", perRun)
	}
	if h.n == 0 {
		t.Error("callLoop recorded nothing while the window was open")
	}
	if n := testing.AllocsPerRun(10, func() { readProcStats() }); n != 0 {
		t.Errorf("readProcStats allocated %.1f times, want 0", n)
	}
}
