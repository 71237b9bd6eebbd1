package tokenbucket_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	for _, mode := range []string{"reject", "backoff"} {
		t.Run(mode, func(t *testing.T) {
			plugintest.Filter(t, tokenbucket.Factory, plugintest.FilterConfig{
				// A bucket the suite's calls cannot empty.
				Options:       map[string]any{"rate": 1e6, "burst": 1000000, "mode": mode},
				BadOptions:    map[string]any{"burst": 0},
				BadOptionsKey: "burst",
			})
		})
	}
}

func testConfig(t *testing.T) *kernrpc.Config { return enginetest.Config(t) }

// startServer serves Echo.Who with filters, counting the handler's calls.
func startServer(t *testing.T, cfg *kernrpc.Config, filters ...kernrpc.FilterConfig) *atomic.Int64 {
	t.Helper()
	var calls atomic.Int64
	enginetest.Serve(t, enginetest.WithFilters(cfg, filters...), func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
			calls.Add(1)
			return &echopb.Echo{Text: "hi"}, nil
		})
	})
	return &calls
}

func newClient(t *testing.T, cfg *kernrpc.Config, filters ...kernrpc.FilterConfig) *kernrpc.Client {
	t.Helper()
	return enginetest.Dial(t, enginetest.WithFilters(cfg, filters...))
}

// A server limited to a burst of 5 and 10/s answers a rush of 20 calls:
// 5 reach the handler, the others come back ResourceExhausted with a
// retry-after the client can read, and after that wait a call passes.
func TestServerRejectsOverTheRateAndSaysWhenToComeBack(t *testing.T) {
	cfg := testConfig(t)
	handled := startServer(t, cfg, kernrpc.FilterConfig{Name: tokenbucket.Name, Side: "server", Options: map[string]any{"rate": 10, "burst": 5}})
	cli := newClient(t, cfg)
	var passed, rejected int
	var retryAfter time.Duration
	var lastErr error
	for range 20 {
		md, err := cli.CallWithMetadata(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
		switch kernel.CodeOf(err) {
		case kernel.OK:
			passed++
		case kernel.ResourceExhausted:
			rejected++
			ms, perr := strconv.Atoi(md[tokenbucket.RetryAfterKey])
			if perr != nil || ms < 1 || ms > 100 {
				t.Fatalf("rejection's %s = %q, want 1 to 100 ms", tokenbucket.RetryAfterKey, md[tokenbucket.RetryAfterKey])
			}
			retryAfter, lastErr = time.Duration(ms)*time.Millisecond, err
		default:
			t.Fatalf("call: %v", err)
		}
	}
	t.Logf("20 calls at once: %d passed, %d rejected; the last rejection: %v (%s: %v)", passed, rejected, lastErr, tokenbucket.RetryAfterKey, retryAfter)
	// The rush takes a few ms, in which the bucket may refill a token.
	if passed < 5 || passed > 6 || int(handled.Load()) != passed {
		t.Errorf("%d calls passed and the handler ran %d times; want the burst of 5 (6 if a token came) and no rejected call handled", passed, handled.Load())
	}
	time.Sleep(retryAfter)
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Errorf("after waiting the retry-after: %v", err)
	}
}

// A client in mode backoff spaces its calls out at the rate instead of
// failing them.
func TestClientBackoffSpacesCallsOut(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg)
	cli := newClient(t, cfg, kernrpc.FilterConfig{Name: tokenbucket.Name, Side: "client",
		Options: map[string]any{"rate": 50, "burst": 1, "mode": "backoff", "max_wait": "100ms"}})
	start := time.Now()
	const calls = 11
	for i := range calls {
		if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	took := time.Since(start)
	t.Logf("%d calls at 50/s with a burst of 1, in mode backoff: %v, none failed", calls, took)
	if took < 190*time.Millisecond {
		t.Errorf("%d calls took %v; at 50/s the 10 after the first need 200ms", calls, took)
	}
}

// A client in mode backoff rejects at once a call whose deadline comes
// before its token, rather than at the deadline. The token is a second
// away and the deadline 200ms: "at once" is held to half the deadline,
// which a busy machine's scheduling does not reach (a 5ms deadline held
// to 4ms once stood here).
func TestClientBackoffRejectsACallItsDeadlineWouldCut(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg)
	cli := newClient(t, cfg, kernrpc.FilterConfig{Name: tokenbucket.Name, Side: "client",
		Options: map[string]any{"rate": 1, "burst": 1, "mode": "backoff", "max_wait": "2s"}})
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatalf("the call that takes the burst's token: %v", err)
	}
	const deadline = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if took := time.Since(start); kernel.CodeOf(err) != kernel.ResourceExhausted || took > deadline/2 {
		t.Errorf("a token ~1s away, a deadline in %v: %v after %v; want ResourceExhausted at once", deadline, err, took)
	}
}
