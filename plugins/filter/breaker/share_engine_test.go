package breaker_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
)

// shared is a breaker that trips after 3 failures and stays open long
// enough for the test, its state shared through the registry.
var shared = map[string]any{"share": "registry", "min_requests": 3, "open_duration": "30s"}

func breakerOf(t *testing.T, cli *kernrpc.Client) *breaker.Filter {
	t.Helper()
	f, ok := kernrpc.FindPlugin[*breaker.Filter](cli.Plugins(), breaker.Name)
	if !ok {
		t.Fatal("the client has no breaker filter")
	}
	return f
}

// Two clients share a memory namespace: once A's breaker opens for the
// failing instance, B (which never called it) refuses it from its first
// call, and a client with share: none still sends it calls.
func TestSharedOpeningReachesAnotherClient(t *testing.T) {
	cfg := testConfig(t)
	bad := startBackend(t, cfg, "bad", func(int64) bool { return true })
	startBackend(t, cfg, "good-1", nil)
	startBackend(t, cfg, "good-2", nil)
	a, b := newClient(t, cfg, shared), newClient(t, cfg, shared)
	local := newClient(t, cfg, map[string]any{"min_requests": 3, "open_duration": "30s"})

	// A calls until its breaker for the bad instance opens.
	badAddr := bad.srv.Addr()
	fa, fb := breakerOf(t, a), breakerOf(t, b)
	for i := 0; fa.State("Echo.Who", badAddr) != breaker.Open; i++ {
		if i == 100 {
			t.Fatalf("A's breaker for %s did not open in 100 calls (the bad instance took %d)", badAddr, bad.calls.Load())
		}
		_ = a.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	// B hears of it through the registry's watch.
	deadline := time.Now().Add(5 * time.Second)
	for fb.State("Echo.Who", badAddr) != breaker.Open {
		if time.Now().After(deadline) {
			t.Fatalf("B's breaker for %s is %s 5s after A's opened; want open", badAddr, fb.State("Echo.Who", badAddr))
		}
		time.Sleep(2 * time.Millisecond)
	}
	sent := bad.calls.Load()
	for i := range 12 {
		var resp echopb.Echo
		if err := b.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil {
			t.Fatalf("B's call %d: %v; want it answered by a good instance", i, err)
		}
	}
	if n := bad.calls.Load() - sent; n != 0 {
		t.Errorf("B sent %d calls to the instance A's breaker had opened for; want none", n)
	}
	peer := 0.0
	fb.ReportState(func(r kernel.Reading) {
		if r.Name == "breaker_peer_opened_total" && r.Labels[1].Value == badAddr {
			peer = r.Value
		}
	})
	if peer != 1 {
		t.Errorf("B's breaker_peer_opened_total for %s = %v; want 1", badAddr, peer)
	}

	// share: none judges by its own calls only: it calls the bad instance.
	for range 12 {
		_ = local.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	if bad.calls.Load() == sent {
		t.Error("the client with share: none sent no call to the bad instance: the test cannot tell sharing from chance")
	}
}

// The share block of docs/governance.md loads and builds.
func TestGovernanceDocShareBlock(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/governance.md")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, b := range strings.Split(string(raw), "```yaml\n")[1:] {
		if b, _, _ = strings.Cut(b, "```"); strings.Contains(b, "share: registry") {
			block = b
		}
	}
	if block == "" {
		t.Fatal("docs/governance.md has no yaml block with share: registry")
	}
	cfg, err := kernrpc.ParseConfig([]byte(block), "governance.yaml")
	if err != nil {
		t.Fatalf("the block does not load: %v\n%s", err, block)
	}
	if len(cfg.Filters) != 1 || cfg.Filters[0].Name != breaker.Name {
		t.Fatalf("the block configures %+v; want one breaker", cfg.Filters)
	}
	f, err := breaker.Factory.Build(cfg.Filters[0].Options, "governance.md")
	if err != nil {
		t.Fatalf("the block's options do not build: %v", err)
	}
	f.(*breaker.Filter).Close()
}
