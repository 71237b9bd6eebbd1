package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary play the server child: the harness
// re-executes os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	if isServe(os.Args[1:]) {
		os.Exit(serveMain(os.Args[1:]))
	}
	if isClientChild(os.Args[1:]) {
		os.Exit(clientMain(os.Args[1:]))
	}
	// The harness's clients, servers and timers must all be gone once
	// the tests are: a leak here would also skew a long measurement.
	goleak.VerifyTestMain(m)
}

// runWithin runs the harness on o, as the command does, within d: the
// child processes are this test binary (TestMain).
func runWithin(t *testing.T, d time.Duration, o options) (*benchmark, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return runBenchmarks(ctx, exe, o)
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
		duration: 200 * time.Millisecond, warmup: 50 * time.Millisecond, rounds: 1, modes: []string{modeLong},
		payloads: []int{16}, callers: []int{1}, systems: sys, progress: io.Discard,
	}
	b, err := runWithin(t, 30*time.Second, o)
	if err != nil {
		t.Fatalf("runBenchmarks: %v", err)
	}
	if left := liveChildren(t); len(left) > 0 {
		t.Errorf("server processes still running after the run: pids %v", left)
	}

	for i, r := range b.results[cell{mode: modeLong, payload: 16, callers: 1}] {
		name := sys[i].label
		p50, p99 := r.hist.quantile(0.5), r.hist.quantile(0.99)
		switch {
		case r.calls == 0 || r.qps() <= 0:
			t.Errorf("%s: no calls measured", name)
		case p50 <= 0 || p99 < p50 || r.hist.mean() <= 0:
			t.Errorf("%s: latencies not sane: mean %s p50 %s p99 %s", name, r.hist.mean(), p50, p99)
		case (r.client.mallocs == 0 && !allocFreeCaller(sys[i].name)) || r.server.mallocs == 0:
			// Every system allocates something over hundreds of calls (at
			// least its connection's buffers on the server), so zero means
			// the counters were not read; only a bare ping-pong's caller,
			// and tuned kernrpc over shm-ring's (0.02 allocations a call),
			// may allocate nothing in a run this short.
			t.Errorf("%s: allocations not measured: client %d server %d", name, r.client.mallocs, r.server.mallocs)
		case r.client.cpu <= 0 || r.server.cpu <= 0:
			t.Errorf("%s: CPU time not measured: client %s server %s", name, r.client.cpu, r.server.cpu)
		}
	}

	md := b.markdown("go test")
	for _, want := range append(labels(sys), "## Long connections", "### long, 16 B payload", "| callers", "allocs", "µs", "kernrpc tuned") {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "## Short connections") || strings.Contains(md, "## Many clients") {
		t.Errorf("report has a section for a mode that did not run:\n%s", md)
	}
	// The default path is compared with the peers before the tuned one; each
	// floor is compared with kernrpc over its own transport, and only with
	// that, then the TCP floors with grpc-go; nothing divides by a bare
	// ping-pong's near-zero allocations.
	checkRowsInOrder(t, md, "kernrpc / grpc-go", "kernrpc / net/rpc", "kernrpc generated / grpc-go generated",
		"kernrpc tuned / grpc-go", "kernrpc tuned / kernrpc", "kernrpc generated / kernrpc", "grpc-go generated / grpc-go",
		"kernrpc/shm-ring / kernrpc", "kernrpc / bare TCP", "kernrpc / bare TCP + protobuf", "kernrpc/shm-ring / bare shm-ring",
		"kernrpc/shm-ring / bare shm-ring + protobuf", "bare TCP / grpc-go", "bare TCP + protobuf / grpc-go",
		"bare TCP + protobuf / bare TCP", "bare shm-ring + protobuf / bare shm-ring", "bare shm-ring + protobuf / bare TCP + protobuf")
	if strings.Contains(md, "| kernrpc / bare shm-ring") {
		t.Errorf("report compares kernrpc over tcp-lv with the bare shm-ring ping-pong:\n%s", md)
	}
	for _, line := range strings.Split(md, "\n") {
		if row := splitRow(line); len(row) > 6 && row[0] == "kernrpc / bare TCP" && row[6] != "n/a" {
			t.Errorf("allocation ratio against a bare ping-pong is not n/a: %s", line)
		}
	}
}

// checkRowsInOrder fails unless each row (its leading cells, separated by
// "|") starts a table row of md, in the order given.
func checkRowsInOrder(t *testing.T, md string, rows ...string) {
	t.Helper()
	var cells [][]string
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "|") {
			cells = append(cells, splitRow(line))
		}
	}
	at := 0
	for _, row := range rows {
		want := splitRow(row)
		for at < len(cells) && !(len(cells[at]) >= len(want) && slices.Equal(cells[at][:len(want)], want)) {
			at++
		}
		if at == len(cells) {
			t.Errorf("report lacks a row starting %q after the rows before it:\n%s", row, md)
			return
		}
		at++
	}
}

func splitRow(line string) []string {
	var out []string
	for f := range strings.SplitSeq(strings.Trim(line, "| "), "|") {
		out = append(out, strings.TrimSpace(f))
	}
	return out
}

func isFloor(name string) bool { return slices.Contains(floorSystems, name) }

// allocFreeCaller: a system whose caller may make no allocation at all
// in a tiny run.
func allocFreeCaller(name string) bool { return isFloor(name) || name == "kernrpc-shm-tuned" }

// TestShortAndManyModes runs the short and many modes at the smallest
// scale against kernrpc and its two peers, and checks what makes each
// mode what it is: a short call pays for a connection (many allocations,
// where a call on a long connection makes about two), and the many mode's
// figures come from several client processes.
func TestShortAndManyModes(t *testing.T) {
	sys, err := lookupSystems([]string{"kernrpc", "grpc", "netrpc"})
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		duration: 200 * time.Millisecond, warmup: 50 * time.Millisecond, rounds: 1,
		modes: []string{modeShort, modeMany}, shortCallers: []int{1, 2}, clients: []int{2}, clientCallers: 2, manyPayloads: []int{modePayload},
		systems: sys, progress: io.Discard,
	}
	b, err := runWithin(t, 60*time.Second, o)
	if err != nil {
		t.Fatalf("runBenchmarks: %v", err)
	}
	if left := liveChildren(t); len(left) > 0 {
		t.Errorf("server or client processes still running after the run: pids %v", left)
	}
	if len(b.cells) != 3 {
		t.Fatalf("cells %v, want short at 1 and 2 callers and one many cell", b.cells)
	}
	for _, c := range b.cells {
		for i, r := range b.results[c] {
			name := sys[i].label + ", " + c.String()
			switch {
			case r.calls == 0 || r.hist.n != r.calls || r.hist.mean() <= 0:
				t.Errorf("%s: no calls measured (%d calls, histogram of %d)", name, r.calls, r.hist.n)
			case r.client.mallocs == 0 || r.server.mallocs == 0 || r.client.cpu <= 0 || r.server.cpu <= 0:
				t.Errorf("%s: costs not measured: client %+v server %+v", name, r.client, r.server)
			}
			if r.cold != 0 {
				t.Errorf("%s: %d client processes not warm within %s; 16 B clients fault little and warm at once", name, r.cold, warmLimit(c.clients))
			}
			perCall := r.perCall(float64(r.client.mallocs))
			if c.mode == modeShort && perCall < 20 {
				t.Errorf("%s: %.1f client allocations per call: is a client really made per call?", name, perCall)
			}
		}
	}
	md := b.markdown("go test")
	for _, want := range []string{"## Short connections", "### short, 16 B payload", "## Many clients", "### many, 16 B payload",
		"| clients × callers", "| 2 × 2 ", "Server log records at INFO and above in the measured windows: kernrpc "} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "Cold clients") {
		t.Errorf("report names cold clients, though every client process got warm:\n%s", md)
	}
	if strings.Contains(md, "## Long connections") {
		t.Errorf("report has the long mode, which did not run:\n%s", md)
	}
	_, short, _ := strings.Cut(md, "### short: ratios")
	short, many, _ := strings.Cut(short, "### many: ratios")
	checkRowsInOrder(t, short, "kernrpc / grpc-go | 16 B | 1", "kernrpc / grpc-go | 16 B | 2", "kernrpc / net/rpc | 16 B | 1")
	checkRowsInOrder(t, many, "kernrpc / grpc-go | 16 B | 2 × 2", "kernrpc / net/rpc | 16 B | 2 × 2")
}

// TestClientChildReportsFailure: a client child that cannot reach its
// server says so on the protocol, so that the harness names the cause.
func TestClientChildReportsFailure(t *testing.T) {
	var out strings.Builder
	in := strings.NewReader("start\nstop\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// net/rpc dials at once, so a closed port fails before "ready".
	err := runClientChild(ctx, systems["netrpc"], "127.0.0.1:1", 1, 16, warmLimitMin, in, &out)
	if err == nil || !strings.HasPrefix(out.String(), "error ") || !strings.Contains(out.String(), "127.0.0.1:1") {
		t.Errorf("err %v, output %q: want an error line naming the address", err, out.String())
	}
	var rr roundResult
	if err := rr.addClient(strings.TrimSpace(out.String())); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("addClient of the error line: %v, want the child's error", err)
	}
}

func TestClientResultLine(t *testing.T) {
	var h histogram
	for _, d := range []time.Duration{90, 130, 5 * time.Microsecond, 5 * time.Microsecond, 3 * time.Millisecond} {
		h.record(d)
	}
	var rr roundResult
	if err := rr.addClient("result 5 1000000 40 2500 " + h.encode()); err != nil {
		t.Fatal(err)
	}
	if rr.hist.n != 5 || rr.hist.mean() != h.mean() || rr.hist.quantile(0.5) != h.quantile(0.5) || rr.hist.quantile(1) != 3*time.Millisecond {
		t.Errorf("histogram came back as n %d mean %s p50 %s max %s", rr.hist.n, rr.hist.mean(), rr.hist.quantile(0.5), rr.hist.quantile(1))
	}
	if rr.client.mallocs != 40 || rr.client.cpu != 2500 {
		t.Errorf("client costs %+v, want 40 mallocs and 2.5 µs", rr.client)
	}
	var empty histogram
	for _, bad := range []string{
		"stats 1 2",
		"result 5 1000000 40 x " + h.encode(),
		"result 4 1000000 40 2500 " + h.encode(), // calls and histogram disagree
		"result 0 1000000 40 2500 0 0 0 9999999:1",
		"result 0 1 2 3 " + empty.encode() + " extra",
	} {
		if err := new(roundResult).addClient(bad); err == nil {
			t.Errorf("addClient(%q) accepted it", bad)
		}
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

// A percentile is the nearest rank rounded up: of 158 calls of 1 ms and
// 2 of 100 ms, p99 is 100 ms (1.25% of the calls took that long), where
// the nearest rank rounded to the nearest would say 1 ms.
func TestQuantileRoundsTheRankUp(t *testing.T) {
	var h histogram
	for range 158 {
		h.record(time.Millisecond)
	}
	h.record(100 * time.Millisecond)
	h.record(100 * time.Millisecond)
	if got := h.quantile(0.99); got < 99*time.Millisecond {
		t.Errorf("p99 of 158 calls of 1ms and 2 of 100ms = %s, want about 100ms", got)
	}
	if got := h.quantile(0.5); got > 2*time.Millisecond {
		t.Errorf("p50 = %s, want about 1ms", got)
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
				o.rounds == 3 && o.duration == 2*time.Second && o.warmup == 300*time.Millisecond && o.server.aliasRequests &&
				slices.Equal(o.modes, modeOrder) && slices.Equal(o.shortCallers, []int{1, 4}) && slices.Equal(o.clients, []int{16}) && o.clientCallers == 4 && slices.Equal(o.manyPayloads, []int{16}) &&
				o.systems[0].name == "kernrpc" && o.systems[1].name == "kernrpc-tuned" &&
				slices.Equal(o.streamSizes, []int{16, 64 << 10}) && slices.Equal(o.streams, []int{1, 16}) && o.streamDuration == 500*time.Millisecond
		}},
		{"the stream mode has its cells", []string{"-mode=stream", "-stream-sizes=1KiB", "-streams=2,3", "-stream-duration=1s"}, "", func(o options) bool {
			cs := o.cells()
			return len(cs) == 2 && cs[0] == cell{mode: modeStream, payload: 1 << 10, callers: 2} && cs[1].callers == 3 &&
				o.windowOf(cs[0]) == time.Second && o.windowOf(cell{mode: modeLong}) == o.duration
		}},
		{"stream sizes checked", []string{"-stream-sizes=16,2MiB"}, "-stream-sizes: size \"2MiB\" is over 1 MiB", nil},
		{"zero streams rejected", []string{"-streams=0"}, `-streams: bad callers count "0"`, nil},
		{"zero stream duration rejected", []string{"-stream-duration=0s"}, "-stream-duration must be positive", nil},
		{"the stream mode needs a system that streams", []string{"-mode=all", "-systems=netrpc"}, "the stream mode needs a system that streams", nil},
		{"net/rpc alone runs the other modes", []string{"-mode=long,short,many", "-systems=netrpc"}, "", func(o options) bool {
			return len(o.systems) == 1 && !slices.Contains(o.modes, modeStream)
		}},
		{"modes keep their order", []string{"-mode=many, long"}, "", func(o options) bool {
			return slices.Equal(o.modes, []string{modeLong, modeMany})
		}},
		{"all is every mode", []string{"-mode=short,all"}, "", func(o options) bool { return slices.Equal(o.modes, modeOrder) }},
		{"all does not hide a misspelt mode", []string{"-mode=all,shrot"}, `unknown mode "shrot"`, nil},
		{"unknown mode is named", []string{"-mode=fast"}, `-mode: unknown mode "fast"; known: long, short, many, stream, or all`, nil},
		{"empty mode rejected", []string{"-mode="}, "-mode: no mode given", nil},
		{"zero client processes rejected", []string{"-clients=1,0"}, `-clients: bad client process count "0": want an integer from 1 to 256`, nil},
		{"too many client processes rejected", []string{"-clients=257"}, `-clients: bad client process count "257"`, nil},
		{"zero callers per client process rejected", []string{"-client-callers=0"}, "-client-callers must be from 1 to 10000", nil},
		{"the many mode takes a payload size", []string{"-mode=many", "-many-payload=64KiB"}, "", func(o options) bool {
			cs := o.cells()
			return len(cs) == 1 && cs[0] == cell{mode: modeMany, payload: 64 << 10, callers: 4, clients: 16}
		}},
		{"the many mode has a row per client count, for each payload", []string{"-mode=many", "-many-payload=16,64KiB", "-clients=1,8", "-client-callers=1"}, "", func(o options) bool {
			cs := o.cells()
			return len(cs) == 4 && cs[0] == cell{mode: modeMany, payload: 16, callers: 1, clients: 1} &&
				cs[1].clients == 8 && cs[1].payload == 16 && cs[2].clients == 1 && cs[3] == cell{mode: modeMany, payload: 64 << 10, callers: 1, clients: 8}
		}},
		{"the many mode's payload is checked", []string{"-many-payload=2MiB"}, "-many-payload: size \"2MiB\" is over 1 MiB", nil},
		{"short callers checked", []string{"-short-callers=1,x"}, `-short-callers: bad callers count "x"`, nil},
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
	phase := newRoundPhase()
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
		if err := callLoop(ctx, call, 16, phase, h); err != nil {
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

// streamLoop counts every message, times the gap before about one in
// gapStride, and allocates nothing.
func TestStreamLoopCountsEveryMessageAndTimesSome(t *testing.T) {
	const messages = 16000
	phase := newRoundPhase()
	h := new(histogram)
	sent := 0
	call := func(context.Context) (int, error) {
		if sent++; sent == messages {
			phase.Store(phaseStop)
		}
		return 16, nil
	}
	allocs := testing.AllocsPerRun(1, func() { // run twice: the last one is kept
		sent, *h = 0, histogram{}
		phase.Store(phaseMeasure)
		if err := streamLoop(context.Background(), call, 16, phase, h); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("streamLoop allocated %.1f times, want 0", allocs)
	}
	// The call that stops the loop is not counted, as in callLoop.
	if h.n != messages-1 {
		t.Errorf("counted %d messages, want %d", h.n, messages-1)
	}
	if lo, hi := uint64(messages/gapStride*8/10), uint64(messages/gapStride*12/10); h.samples < lo || h.samples > hi {
		t.Errorf("timed %d gaps of %d messages, want about one in %d (%d to %d)", h.samples, h.n, gapStride, lo, hi)
	}
	var back histogram
	if err := back.decode(h.encode()); err != nil || back.n != h.n || back.samples != h.samples {
		t.Errorf("decoded %d events, %d samples (%v); want %d, %d", back.n, back.samples, err, h.n, h.samples)
	}
}

// The server child's log handler counts every record at INFO and above and
// prints only warnings and errors, so that the report can say how many a
// server wrote without them filling the terminal.
func TestCountingHandler(t *testing.T) {
	var out strings.Builder
	h := &countingHandler{slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn})}
	l := slog.New(h).With("component", "test")
	before := serverLogs.Load()
	l.Debug("not counted")
	l.Info("connection closed")
	l.WithGroup("g").Warn("slow")
	if got := serverLogs.Load() - before; got != 2 {
		t.Errorf("counted %d records, want 2 (INFO and WARN, not DEBUG)", got)
	}
	if s := out.String(); strings.Contains(s, "connection closed") || !strings.Contains(s, "slow") || !strings.Contains(s, "component=test") {
		t.Errorf("printed %q: want the warning with its attributes, not the info", s)
	}
}

// The results say which Go runtime settings the environment gave every
// process: GOGC alone moves the 64 KiB figures by half.
func TestRuntimeEnvNamesWhatTheEnvironmentSets(t *testing.T) {
	none := runtimeEnv(func(string) string { return "" })
	if !strings.Contains(none, "defaults") {
		t.Errorf("no settings in the environment: %q, want it to say the defaults", none)
	}
	env := map[string]string{"GOGC": "400", "GOMEMLIMIT": "1GiB"}
	got := runtimeEnv(func(k string) string { return env[k] })
	if got != "GOGC=400, GOMEMLIMIT=1GiB, from the environment, in every process" {
		t.Errorf("GOGC and GOMEMLIMIT set: %q", got)
	}
}

// A ratio prints n/a without a divisor, 0.00× only for a zero dividend,
// and <0.01× for one too small for two decimals: a peer that finished a
// handful of calls in a round (TestGeneratedSystems on a loaded CI
// machine) must not read as a figure that was not measured.
func TestFmtRatio(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		want string
	}{
		{1, 0, "n/a"},
		{0, 5, "0.00×"},
		{1, 250, "<0.01×"},
		{1, 200, "0.01×"},
		{3, 2, "1.50×"},
	} {
		if got := fmtRatio(c.a, c.b); got != c.want {
			t.Errorf("fmtRatio(%g, %g) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}
