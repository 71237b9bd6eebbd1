package kernrpc

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// headroomPair starts an echo server and a client of it with cfg's
// gc_headroom, each closed at the test's end.
func headroomPair(t *testing.T, headroom *kernel.Size) (*Server, *Client) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": t.Name()}
	cfg.GCHeadroom = headroom
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	Handle(srv, "Echo.Echo", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil })
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	cli, err := NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return srv, cli
}

func echoOnce(t *testing.T, cli *Client, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := &echopb.Echo{Payload: bytes.Repeat([]byte{3}, size)}
	var resp echopb.Echo
	if err := cli.Call(ctx, "Echo.Echo", req, &resp); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.Payload, req.Payload) {
		t.Fatalf("echo of %d bytes came back as %d bytes", size, len(resp.Payload))
	}
}

func (h *headroomHold) isHeld() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func (h *gcHeadroom) holderCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holders
}

// skipIfGCTuned skips a test that needs the runtime's default collector
// settings, which GOGC or GOMEMLIMIT in the test's environment change.
func skipIfGCTuned(t *testing.T) {
	if gcTunedByProgram() {
		t.Skip("GOGC or GOMEMLIMIT is set: kernrpc takes no GC headroom then")
	}
}

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Small calls take no headroom; the first large frame each side reads
// takes it, which raises the collector's heap goal by twice its size; and
// closing gives it back.
func TestGCHeadroomIsTakenAtTheFirstLargeMessage(t *testing.T) {
	skipIfGCTuned(t)
	before := processHeadroom.holderCount()
	srv, cli := headroomPair(t, nil)
	echoOnce(t, cli, 16)
	if srv.headroom.isHeld() || cli.headroom.isHeld() {
		t.Fatalf("16 B calls took GC headroom: server %v, client %v", srv.headroom.isHeld(), cli.headroom.isHeld())
	}
	echoOnce(t, cli, largeFrame)
	if !srv.headroom.isHeld() || !cli.headroom.isHeld() {
		t.Fatalf("after a %d-byte call: server holds headroom %v, client %v; want both", largeFrame, srv.headroom.isHeld(), cli.headroom.isHeld())
	}
	if got := processHeadroom.holderCount() - before; got != 2 {
		t.Fatalf("the process counts %d new holders, want 2 (server and client)", got)
	}
	if got := processHeadroom.size(); got < DefaultGCHeadroom {
		t.Fatalf("the process keeps %d bytes of headroom, want at least %d", got, DefaultGCHeadroom)
	}
	runtime.GC()
	if goal := heapGoal(); goal < 2*DefaultGCHeadroom {
		t.Fatalf("heap goal after a collection is %d bytes; with %d bytes of headroom live it should be at least twice that", goal, DefaultGCHeadroom)
	}

	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.headroom.isHeld() || cli.headroom.isHeld() {
		t.Fatal("a closed server or client still holds GC headroom")
	}
	if got := processHeadroom.holderCount(); got != before {
		t.Fatalf("after Close and Shutdown the process counts %d holders, want %d as before", got, before)
	}
}

func TestGCHeadroomZeroTakesNone(t *testing.T) {
	zero := kernel.Size(0)
	srv, cli := headroomPair(t, &zero)
	echoOnce(t, cli, 64<<10)
	if srv.headroom.isHeld() || cli.headroom.isHeld() {
		t.Fatal("gc_headroom: 0 took headroom")
	}
}

// A program that set GOGC (or a memory limit) has chosen its collector's
// settings; kernrpc leaves them alone.
func TestGCHeadroomLeavesAProgramsOwnGCSettingsAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func() (restore func())
	}{
		{"GOGC 200", func() func() { old := debug.SetGCPercent(200); return func() { debug.SetGCPercent(old) } }},
		{"memory limit 1GiB", func() func() { old := debug.SetMemoryLimit(1 << 30); return func() { debug.SetMemoryLimit(old) } }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(tc.set())
			srv, cli := headroomPair(t, nil)
			echoOnce(t, cli, 64<<10)
			if srv.headroom.isHeld() || cli.headroom.isHeld() {
				t.Fatalf("with %s set, kernrpc took GC headroom", tc.name)
			}
		})
	}
}

// The last holder's release keeps the memory for headroomLinger, so that a
// client made per call does not allocate it each time; a holder that
// comes back meanwhile finds the same memory, and a larger size grows it.
func TestGCHeadroomLingersAfterTheLastHolder(t *testing.T) {
	skipIfGCTuned(t)
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
	if h.size() != 2<<20 {
		t.Fatalf("size %d after asking for 2MiB, want 2MiB", h.size())
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

func TestGCHeadroomConfigErrors(t *testing.T) {
	for _, v := range []kernel.Size{-1, 2 << 30} {
		cfg := DefaultConfig()
		cfg.Source = "svc.yaml"
		cfg.GCHeadroom = &v
		err := cfg.validateFields()
		if err == nil || !strings.Contains(err.Error(), "gc_headroom") || !strings.Contains(err.Error(), "svc.yaml") {
			t.Errorf("gc_headroom %d: err %v, want one naming gc_headroom and svc.yaml", v, err)
		}
	}
}

// gc_headroom: 0 in a file means none, not the default.
func TestGCHeadroomFromAFile(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  kernel.Size
	}{{"0", 0}, {"64MiB", 64 << 20}, {"", DefaultGCHeadroom}} {
		path := filepath.Join(t.TempDir(), "kernrpc.yaml")
		body := "service: echo\n"
		if tc.value != "" {
			body += "gc_headroom: " + tc.value + "\n"
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.GCHeadroom == nil || *cfg.GCHeadroom != tc.want {
			t.Errorf("gc_headroom %q loaded as %v, want %v", tc.value, cfg.GCHeadroom, tc.want)
		}
	}
}
