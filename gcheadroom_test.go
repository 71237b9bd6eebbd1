package kernrpc

import (
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Test hooks for gcheadroom_engine_test.go, in package kernrpc_test.

// LargeFrame is the payload size from which a frame takes GC headroom.
const LargeFrame = largeFrame

// HeadroomHolders is how many Servers and Clients hold the process's
// headroom.
func HeadroomHolders() int { return processHeadroom.holderCount() }

// HeadroomWithin is headroomWithin: the headroom the process keeps when
// size is asked for.
func HeadroomWithin(size int) int { return headroomWithin(size) }

// GCTunedByProgram is gcTunedByProgram.
func GCTunedByProgram() bool { return gcTunedByProgram() }

func (h *gcHeadroom) holderCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holders
}

// The last holder's release keeps the memory for headroomLinger, so that a
// client made per call does not allocate it each time; a holder that
// comes back meanwhile finds the same memory, and a larger size grows it.
func TestGCHeadroomLingersAfterTheLastHolder(t *testing.T) {
	if gcTunedByProgram() {
		t.Skip("GOGC or GOMEMLIMIT is set: kernrpc takes no GC headroom then")
	}
	old := headroomLinger
	headroomLinger = 20 * time.Millisecond
	t.Cleanup(func() { headroomLinger = old })
	var h gcHeadroom
	if !h.acquire(1 << 20) {
		t.Fatal("acquire refused with the runtime's default GC settings")
	}
	first := &h.mem[0]
	h.release()
	if !h.acquire(1 << 20) {
		t.Fatal("second acquire refused")
	}
	if &h.mem[0] != first {
		t.Fatal("a holder that came back within the linger got new memory")
	}
	h.acquire(2 << 20)
	if want := headroomWithin(2 << 20); h.size() != want {
		t.Fatalf("size %d after asking for 2MiB, want %d", h.size(), want)
	}
	h.release()
	time.Sleep(5 * headroomLinger)
	if h.size() == 0 {
		t.Fatal("dropped while a holder remained")
	}
	h.release()
	deadline := time.Now().Add(5 * time.Second)
	for h.size() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still %d bytes, 5s after the last holder left (linger %v)", h.size(), headroomLinger)
		}
		time.Sleep(headroomLinger)
	}
}

// A Close racing the first large frame never leaves a holder behind.
func TestGCHeadroomHoldRacingRelease(t *testing.T) {
	before := processHeadroom.holderCount()
	for range 200 {
		h := headroomHold{size: 1 << 20, log: func() *slog.Logger { return slog.New(slog.DiscardHandler) }}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); h.noteFrame(largeFrame) }()
		go func() { defer wg.Done(); h.release() }()
		wg.Wait()
		h.noteFrame(largeFrame) // after release: takes nothing
	}
	if got := processHeadroom.holderCount(); got != before {
		t.Fatalf("%d holders after 200 holds each released, want %d", got, before)
	}
}
