package faultharness_test

import (
	"runtime"
	"testing"
	"time"
)

// kind is one fault turned on, and how much of a run it needs.
type kind struct {
	name   string
	faults map[string]any
	// calls is fewer where most calls wait out their deadline.
	calls   int
	garbles bool
}

var kinds = []kind{
	{name: "none", faults: map[string]any{}},
	{name: "delay", faults: map[string]any{"delay": "2ms", "delay_jitter": "20ms"}},
	{name: "drop", faults: map[string]any{"drop": 0.03}},
	{name: "duplicate-requests", faults: map[string]any{"duplicate": 0.05, "side": "dial"}},
	{name: "duplicate-responses", faults: map[string]any{"duplicate": 0.2, "side": "listen"}},
	{name: "corrupt-payload", faults: map[string]any{"corrupt": 0.05}, garbles: true},
	{name: "corrupt-frame", faults: map[string]any{"corrupt": 0.005, "corrupt_in": "frame"}, garbles: true},
	{name: "truncate", faults: map[string]any{"truncate": 0.05}, garbles: true},
	{name: "reset", faults: map[string]any{"reset": 0.002}},
	{name: "reset-after", faults: map[string]any{"reset_after": 300}},
	{name: "stall-dial", faults: map[string]any{"stall_after": 150, "side": "dial"}, calls: 600},
	{name: "stall-listen", faults: map[string]any{"stall_after": 150, "side": "listen"}, calls: 600},
	{name: "blackhole-dial", faults: map[string]any{"blackhole": true, "side": "dial"}, calls: 400},
	{name: "blackhole-listen", faults: map[string]any{"blackhole": true, "side": "listen"}, calls: 400},
}

// TestExactlyOneAnswer runs every fault kind over tcp-lv and shm-ring.
func TestExactlyOneAnswer(t *testing.T) {
	for _, tr := range harnessTransports() {
		for _, k := range kinds {
			t.Run(tr+"/"+k.name, func(t *testing.T) {
				r := &run{transport: tr, faults: k.faults, calls: k.calls, concurrency: 128,
					deadline: 300 * time.Millisecond, garbles: k.garbles}
				if r.calls == 0 {
					r.calls = 2000
				}
				r.exercise(t)
			})
		}
	}
}

// harnessTransports are the transports the faults wrap: tcp-lv, and
// shm-ring where it runs.
func harnessTransports() []string {
	if runtime.GOOS == "linux" {
		return []string{"tcp-lv", "shm-ring"}
	}
	return []string{"tcp-lv"}
}
