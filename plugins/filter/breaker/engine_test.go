package breaker_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, breaker.Factory, plugintest.FilterConfig{
		Side:          kernel.ClientSide,
		Options:       map[string]any{"min_requests": 5},
		BadOptions:    map[string]any{"failure_ratio": 1.5},
		BadOptionsKey: "failure_ratio",
	})
}

// With share: registry the filter observes the plugins and closes; it
// keeps the contract the same way.
func TestConformanceShared(t *testing.T) {
	plugintest.Filter(t, breaker.Factory, plugintest.FilterConfig{
		Side:          kernel.ClientSide,
		Options:       map[string]any{"min_requests": 5, "share": "registry"},
		BadOptions:    map[string]any{"share": "gossip"},
		BadOptionsKey: "share",
	})
}

// testConfig gives each test a registry namespace of its own.
func testConfig(t *testing.T) *kernrpc.Config { return enginetest.Config(t) }

// backend is one server of the service, answering Echo.Who with its name
// (also in the response metadata, failures included) and counting calls.
type backend struct {
	name  string
	srv   *kernrpc.Server
	calls atomic.Int64
}

// startBackend starts a server; fail says whether its nth call fails.
func startBackend(t *testing.T, cfg *kernrpc.Config, name string, fail func(n int64) bool) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
			n := b.calls.Add(1)
			kernrpc.CallInfoFrom(ctx).SetResponseMetadata("from", name)
			if fail != nil && fail(n) {
				return nil, kernel.Errorf(kernel.Unavailable, "%s: dependency down", name)
			}
			return &echopb.Echo{Text: name}, nil
		})
	})
	return b
}

func newClient(t *testing.T, cfg *kernrpc.Config, options map[string]any) *kernrpc.Client {
	t.Helper()
	return enginetest.Dial(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: breaker.Name, Side: "client", Options: options}))
}

// Three instances of one service, one of which fails every other call:
// its breaker opens, and it gets almost no traffic; the others answer the
// rest, and no call they take fails.
func TestFailingInstanceLosesItsShare(t *testing.T) {
	shareOfAFailingInstance(t, func(n int64) bool { return n%2 == 0 }, map[string]any{
		"min_requests": 10, "window_duration": "1s", "open_duration": "250ms", "half_open_probes": 3,
	})
}

// The same in mode sre, with an instance that fails 9 calls in 10: with
// k = 2 adaptive throttling leaves alone a backend that accepts at least
// half of its calls, so the failing one must fail more than that.
func TestSREThrottlesAFailingInstance(t *testing.T) {
	shareOfAFailingInstance(t, func(n int64) bool { return n%10 != 0 }, map[string]any{
		"mode": "sre", "min_requests": 10, "window_duration": "1s",
	})
}

func shareOfAFailingInstance(t *testing.T, fail func(n int64) bool, options map[string]any) {
	cfg := testConfig(t)
	bad := startBackend(t, cfg, "bad", fail)
	good := []*backend{startBackend(t, cfg, "good-1", nil), startBackend(t, cfg, "good-2", nil)}
	cli := newClient(t, cfg, options)

	const callers, runFor = 4, 1500 * time.Millisecond
	var (
		mu       sync.Mutex
		total    int
		failedBy = map[string]int{}
		served   = map[string]int{}
		other    []error
	)
	deadline := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				var resp echopb.Echo
				md, err := cli.CallWithMetadata(context.Background(), "Echo.Who", &echopb.Echo{}, &resp)
				mu.Lock()
				total++
				switch {
				case err == nil:
					served[resp.Text]++
				case md["from"] != "":
					failedBy[md["from"]]++
				default:
					other = append(other, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	badCalls := bad.calls.Load()
	goodCalls := good[0].calls.Load() + good[1].calls.Load()
	share := float64(badCalls) / float64(badCalls+goodCalls)
	t.Logf("%d calls in %v from %d callers: bad instance %d (%.2f%% of the traffic; %d failed), good-1 %d, good-2 %d; "+
		"failed calls by instance: %v; calls that failed elsewhere: %d",
		total, runFor, callers, badCalls, 100*share, failedBy["bad"], good[0].calls.Load(), good[1].calls.Load(), failedBy, len(other))
	if share >= 0.05 {
		t.Errorf("the failing instance took %.2f%% of the calls, want under 5%%: its breaker did not keep traffic away", 100*share)
	}
	for _, g := range good {
		if failedBy[g.name] != 0 || int64(served[g.name]) != g.calls.Load() {
			t.Errorf("%s: %d calls failed, %d answered of %d it took; want every one answered", g.name, failedBy[g.name], served[g.name], g.calls.Load())
		}
	}
	if len(other) > 0 {
		t.Errorf("%d calls failed without reaching an instance, e.g. %v", len(other), other[0])
	}
	if failedBy["bad"] == 0 {
		t.Error("the bad instance failed no call: the test did not test anything")
	}
}

// When every instance's breaker is open, a call fails at once with
// Unavailable, and the message names the breaker.
func TestEveryInstanceOpenFailsFast(t *testing.T) {
	cfg := testConfig(t)
	always := func(int64) bool { return true }
	var backends []*backend
	for _, n := range []string{"a", "b", "c"} {
		backends = append(backends, startBackend(t, cfg, n, always))
	}
	cli := newClient(t, cfg, map[string]any{"min_requests": 3, "open_duration": "10s"})
	for range 9 { // three failures on each instance
		_ = cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	}
	var sent int64
	for _, b := range backends {
		sent += b.calls.Load()
	}
	start := time.Now()
	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	took := time.Since(start)
	t.Logf("every breaker open: the call failed in %v with: %v", took, err)
	if kernel.CodeOf(err) != kernel.Unavailable {
		t.Fatalf("code %v, want Unavailable", kernel.CodeOf(err))
	}
	for _, want := range []string{"no instance of \"echo\" took Echo.Who", "breaker: circuit for Echo.Who on 127.0.0.1:", "is open"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message does not say %q", want)
		}
	}
	if took > 100*time.Millisecond {
		t.Errorf("took %v to fail, want at once", took)
	}
	var after int64
	for _, b := range backends {
		after += b.calls.Load()
	}
	if after != sent {
		t.Errorf("%d calls reached an instance whose breaker is open", after-sent)
	}
}

// A server entry for the breaker is a config error, worded as
// docs/plugins.md quotes it.
func TestServerEntryIsAConfigError(t *testing.T) {
	cfg := testConfig(t)
	cfg.Source = "kernrpc.yaml"
	cfg.Filters = []kernrpc.FilterConfig{{Name: breaker.Name, Side: "server"}}
	srv, err := kernrpc.NewServer(cfg)
	const want = `kernrpc: kernrpc.yaml: filters[0].side is server, but filter "breaker" works on the client side only; set side: client, or leave side out`
	if err == nil || err.Error() != want {
		if srv != nil {
			_ = srv.Shutdown(context.Background())
		}
		t.Fatalf("NewServer: %v; want %s", err, want)
	}
}
