package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAwaitWarmHeapEnds checks each way the wait for a warm heap ends:
// a process busy without faulting is warm after a span or two, and a failed caller or a
// cancelled context ends the wait before its first span.
func TestAwaitWarmHeapEnds(t *testing.T) {
	// A caller busy without touching new memory: CPU time, few faults.
	busy, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(busy)
		for n := 0; ; n++ {
			if n%1024 == 0 {
				select {
				case <-stop:
					return
				default:
				}
			}
		}
	}()
	d, warm := timeWarm(context.Background(), make(chan error))
	close(stop)
	<-busy
	if d >= warmLimitMin || !warm {
		t.Errorf("a process busy but allocating nothing waited %s and was warm %v; want warm before the limit (%s)", d, warm, warmLimitMin)
	}

	failed := make(chan error, 1)
	failed <- errors.New("a caller failed")
	if d, warm := timeWarm(context.Background(), failed); d >= warmSpan || warm {
		t.Errorf("with a caller failed the wait took %s and was warm %v; want it to end, not warm, before the first span (%s)", d, warm, warmSpan)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d, warm := timeWarm(ctx, make(chan error)); d >= warmSpan || warm {
		t.Errorf("with its context cancelled the wait took %s and was warm %v; want it to end, not warm, before the first span (%s)", d, warm, warmSpan)
	}
}

func timeWarm(ctx context.Context, errs chan error) (time.Duration, bool) {
	t0 := time.Now()
	warm := awaitWarmHeap(ctx, errs, warmLimitMin)
	return time.Since(t0), warm
}

// A many-mode cell whose client processes were not all warm is named in
// the report's header, with how many of how many were cold.
func TestReportNamesColdClients(t *testing.T) {
	sys, err := lookupSystems([]string{"kernrpc", "grpc"})
	if err != nil {
		t.Fatal(err)
	}
	c := cell{mode: modeMany, payload: 64 << 10, callers: 1, clients: 32}
	b := &benchmark{opts: options{systems: sys}, cells: []cell{c},
		results: map[cell][]*result{c: {{cold: 5, roundQPS: []float64{1, 2}}, {roundQPS: []float64{1, 2}}}}}
	want := sys[0].label + ", " + c.String() + " (5 of 64)"
	if got := b.coldCells(); got != want {
		t.Errorf("coldCells() = %q, want %q (grpc-go's clients were all warm)", got, want)
	}
}

// A span is judged by faults per millisecond of CPU time, and only once
// the process ran warmMinCPU in it.
func TestSpanWarm(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		faults       int64
		ran          time.Duration
		judged, warm bool
	}{
		{0, 10 * ms, true, true},
		{49, 5 * ms, true, true},        // 9.8 a millisecond
		{50, 5 * ms, true, false},       // 10
		{16 * 40, 20 * ms, true, false}, // a cold 64 KiB client: 16 a call, a call every 500 µs
		{2, ms, false, false},           // too little CPU to tell: a process kept from a core
		{0, warmMinCPU - 1, false, false},
	} {
		judged, warm := spanWarm(tc.faults, tc.ran)
		if judged != tc.judged || warm != tc.warm {
			t.Errorf("spanWarm(%d faults, %s) = judged %v, warm %v; want %v, %v", tc.faults, tc.ran, judged, warm, tc.judged, tc.warm)
		}
	}
}

// A cell's client processes warm at once, sharing the cores: the more
// there are, the longer each may take, and a client child refuses a
// limit that would leave it no time at all.
func TestWarmLimitGrowsWithClients(t *testing.T) {
	for _, tc := range []struct {
		clients int
		want    time.Duration
	}{{1, warmLimitMin}, {16, warmLimitMin}, {32, 32 * warmLimitPerClient}} {
		if got := warmLimit(tc.clients); got != tc.want {
			t.Errorf("warmLimit(%d) = %s, want %s", tc.clients, got, tc.want)
		}
	}
	if got := warmLimit(32); got <= warmLimitMin {
		t.Errorf("warmLimit(32) = %s: 32 clients at 64 KiB took up to 12.2 s to warm, more than %s", got, warmLimitMin)
	}
	for _, limit := range []string{"0s", "-1s"} {
		if code := clientMain([]string{"-client=netrpc", "-addr=127.0.0.1:1", "-warm-limit=" + limit}); code != 2 {
			t.Errorf("a client child with -warm-limit=%s exited %d, want 2 (a usage error)", limit, code)
		}
	}
}
