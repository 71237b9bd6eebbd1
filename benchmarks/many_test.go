package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// With one client process beside more, the many mode's report divides
// each system's rows by its one-process row of the same payload and
// callers, and leaves out what it cannot divide: a row of another
// payload, or a system without the one-process row.
func TestManyTogetherDividesByOneClient(t *testing.T) {
	sys, err := lookupSystems([]string{"kernrpc-shm", "bare-shm"})
	if err != nil {
		t.Fatal(err)
	}
	res := func(calls uint64, clientCPU, serverCPU time.Duration) *result {
		return &result{calls: calls, elapsed: time.Second,
			client: procStats{cpu: clientCPU}, server: procStats{cpu: serverCPU}}
	}
	one := cell{mode: modeMany, payload: 64 << 10, callers: 1, clients: 1}
	eight := cell{mode: modeMany, payload: 64 << 10, callers: 1, clients: 8}
	other := cell{mode: modeMany, payload: 16, callers: 1, clients: 8}
	b := &benchmark{opts: options{systems: sys}, cells: []cell{one, eight, other},
		results: map[cell][]*result{
			one:   {res(20000, time.Second, time.Second), nil},
			eight: {res(30000, 3*time.Second, time.Second), res(50000, time.Second, time.Second)},
			other: {res(90000, time.Second, time.Second), res(90000, time.Second, time.Second)},
		}}
	var w strings.Builder
	b.manyTogether(&w)
	got := w.String()
	// 30k ÷ 20k calls/s; client CPU a call 100 µs ÷ 50 µs; server 33.3 µs ÷ 50 µs.
	want := "| " + sys[0].label + " | 64 KiB | 8 × 1 ÷ 1 × 1 | 1.50× | 2.00× | 0.67× |"
	if !strings.Contains(strings.Join(strings.Fields(got), " "), strings.Join(strings.Fields(want), " ")) {
		t.Errorf("report lacks the row %q:\n%s", want, got)
	}
	if n := strings.Count(got, "÷ 1 × 1"); n != 1 {
		t.Errorf("%d divided rows, want 1 (bare-shm has no one-process row, 16 B none either):\n%s", n, got)
	}

	b.cells = []cell{eight, other}
	w.Reset()
	b.manyTogether(&w)
	if w.Len() != 0 {
		t.Errorf("without a one-process row the section is left out, got:\n%s", w.String())
	}
}

// The many mode's cells of one payload and callers take turns round by
// round; every other cell runs alone, in order.
func TestTurnGroups(t *testing.T) {
	cells := []cell{
		{mode: modeLong, payload: 16, callers: 1},
		{mode: modeLong, payload: 16, callers: 4},
		{mode: modeMany, payload: 16, callers: 1, clients: 1},
		{mode: modeMany, payload: 16, callers: 1, clients: 8},
		{mode: modeMany, payload: 64 << 10, callers: 1, clients: 1},
		{mode: modeMany, payload: 64 << 10, callers: 1, clients: 8},
		{mode: modeMany, payload: 64 << 10, callers: 1, clients: 32},
		{mode: modeStream, payload: 16, callers: 1},
	}
	got := turnGroups(cells)
	want := [][]int{{0}, {1}, {2, 3}, {4, 5, 6}, {7}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("turnGroups = %v, want %v", got, want)
	}
}
