package kernrpc_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// headroomPair is an echo server and a client of it, each with the test
// observer, which reads the engine's state.
type headroomPair struct {
	srv            *kernrpc.Server
	cli            *kernrpc.Client
	srvObs, cliObs *observer
}

// newHeadroomPair starts a headroomPair with the given gc_headroom (nil:
// the default).
func newHeadroomPair(t *testing.T, headroom *kernel.Size) headroomPair {
	t.Helper()
	cfg := testConfig(t)
	cfg.GCHeadroom = headroom
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer"}}
	p := headroomPair{srv: startServer(t, cfg, nil), cli: newClient(t, cfg)}
	p.srvObs, _ = kernrpc.FindPlugin[*observer](p.srv.Plugins(), "test-observer")
	p.cliObs, _ = kernrpc.FindPlugin[*observer](p.cli.Plugins(), "test-observer")
	return p
}

// held is the headroom each side reports holding (server_gc_headroom_bytes,
// client_gc_headroom_bytes).
func (p headroomPair) held(t *testing.T) (server, client float64) {
	t.Helper()
	return p.srvObs.readings(t)["server_gc_headroom_bytes"].Value, p.cliObs.readings(t)["client_gc_headroom_bytes"].Value
}

func echoOnce(t *testing.T, cli *kernrpc.Client, size int) {
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

// skipIfGCTuned skips a test that needs the runtime's default collector
// settings, which GOGC or GOMEMLIMIT in the test's environment change.
func skipIfGCTuned(t *testing.T) {
	if kernrpc.GCTunedByProgram() {
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
	before := kernrpc.HeadroomHolders()
	p := newHeadroomPair(t, nil)
	echoOnce(t, p.cli, 16)
	if srv, cli := p.held(t); srv != 0 || cli != 0 {
		t.Fatalf("16 B calls took GC headroom: server reports %v bytes, client %v", srv, cli)
	}
	echoOnce(t, p.cli, kernrpc.LargeFrame)
	want := kernrpc.HeadroomWithin(kernrpc.DefaultGCHeadroom) // less in a small container
	if srv, cli := p.held(t); srv < float64(want) || cli < float64(want) {
		t.Fatalf("after a %d-byte call the server reports %v bytes of headroom, the client %v; want both at least %d", kernrpc.LargeFrame, srv, cli, want)
	}
	if got := kernrpc.HeadroomHolders() - before; got != 2 {
		t.Fatalf("the process counts %d new holders, want 2 (server and client)", got)
	}
	runtime.GC()
	if goal := heapGoal(); goal < 2*uint64(want) {
		t.Fatalf("heap goal after a collection is %d bytes; with %d bytes of headroom live it should be at least twice that", goal, want)
	}

	if err := p.cli.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if srv, cli := p.held(t); srv != 0 || cli != 0 {
		t.Fatalf("closed, the server reports %v bytes of headroom, the client %v; want none", srv, cli)
	}
	if got := kernrpc.HeadroomHolders(); got != before {
		t.Fatalf("after Close and Shutdown the process counts %d holders, want %d as before", got, before)
	}
}

func TestGCHeadroomZeroTakesNone(t *testing.T) {
	zero := kernel.Size(0)
	p := newHeadroomPair(t, &zero)
	echoOnce(t, p.cli, 64<<10)
	if srv, cli := p.held(t); srv != 0 || cli != 0 {
		t.Fatalf("gc_headroom: 0 took headroom: server %v bytes, client %v", srv, cli)
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
			p := newHeadroomPair(t, nil)
			echoOnce(t, p.cli, 64<<10)
			if srv, cli := p.held(t); srv != 0 || cli != 0 {
				t.Fatalf("with %s set, kernrpc took GC headroom: server %v bytes, client %v", tc.name, srv, cli)
			}
		})
	}
}

func TestGCHeadroomConfigErrors(t *testing.T) {
	for _, v := range []kernel.Size{-1, 2 << 30} {
		cfg := kernrpc.DefaultConfig()
		cfg.Source = "svc.yaml"
		cfg.GCHeadroom = &v
		_, err := kernrpc.NewServer(cfg)
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
	}{{"0", 0}, {"64MiB", 64 << 20}, {"", kernrpc.DefaultGCHeadroom}} {
		path := filepath.Join(t.TempDir(), "kernrpc.yaml")
		body := "service: echo\n"
		if tc.value != "" {
			body += "gc_headroom: " + tc.value + "\n"
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := kernrpc.LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.GCHeadroom == nil || *cfg.GCHeadroom != tc.want {
			t.Errorf("gc_headroom %q loaded as %v, want %v", tc.value, cfg.GCHeadroom, tc.want)
		}
	}
}
