package overload_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/overload"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	for _, mode := range []string{"gradient", "codel"} {
		t.Run(mode, func(t *testing.T) {
			plugintest.Filter(t, overload.Factory, plugintest.FilterConfig{
				Side:          kernel.ServerSide,
				Options:       map[string]any{"mode": mode},
				BadOptions:    map[string]any{"min_limit": 0},
				BadOptionsKey: "min_limit",
			})
		})
	}
}

// The server's capacity is set by a resource the test controls, not by
// the CPU: each call holds one of workers for service, so capacity is
// workers/service calls per second whatever else the machine runs.
const (
	workers = 16
	service = 20 * time.Millisecond
)

type server struct {
	srv  *kernrpc.Server
	held atomic.Int64 // ns the handler held workers, summed
	ran  atomic.Int64
}

func startServer(t *testing.T, name string, filters ...kernrpc.FilterConfig) (*server, *kernrpc.Client) {
	t.Helper()
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": "overload-" + name}
	cfg.Client.Timeout = kernel.Duration(10 * time.Second)
	none := 0
	cfg.Client.Retries = &none // every rejection is counted, not retried
	// The per-connection cap on calls in flight would shed the queue
	// that "without" shows growing; the filter, not the cap, is measured.
	cfg.Server.MaxConcurrentCalls = 1 << 16
	scfg := *cfg
	scfg.Filters = filters
	srv, err := kernrpc.NewServer(&scfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{srv: srv}
	pool := make(chan struct{}, workers)
	kernrpc.Handle(srv, "Echo.Who", func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
		pool <- struct{}{}
		start := time.Now()
		time.Sleep(service)
		s.held.Add(int64(time.Since(start)))
		s.ran.Add(1)
		<-pool
		return &echopb.Echo{Text: "hi"}, nil
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return s, cli
}

// result is one call of an open-loop run.
type result struct {
	sent time.Duration // since the run began
	took time.Duration
	code kernel.Code
	err  error
}

// offer sends calls at rate per second for d, each on its own goroutine
// at its scheduled time (open loop: a slow server does not slow the
// sender), and returns every call's result once all have ended.
func offer(cli *kernrpc.Client, rate float64, d time.Duration) []result {
	n := int(rate * d.Seconds())
	gap := time.Duration(float64(time.Second) / rate)
	out := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; {
		// Launch every call whose time has come: a late wake-up on a busy
		// machine sends the overdue ones at once rather than fewer.
		for ; i < n && time.Duration(i)*gap <= time.Since(start); i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				t0 := time.Now()
				err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
				out[i] = result{sent: t0.Sub(start), took: time.Since(t0), code: kernel.CodeOf(err), err: err}
			}(i)
		}
		time.Sleep(gap)
	}
	wg.Wait()
	return out
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

var firstOther error

func split(rs []result) (ok, rejected []time.Duration, other map[kernel.Code]int) {
	other = map[kernel.Code]int{}
	for _, r := range rs {
		switch r.code {
		case kernel.OK:
			ok = append(ok, r.took)
		case kernel.ResourceExhausted:
			rejected = append(rejected, r.took)
		default:
			if other[r.code] == 0 {
				firstOther = r.err
			}
			other[r.code]++
		}
	}
	return ok, rejected, other
}

// At 3× the server's capacity, with overload, the server keeps doing
// about as much work as it can, the calls it admits are about as fast as
// unloaded, and the excess is told at once; without it, every call waits
// in a queue that grows for as long as the overload lasts.
func TestOverloadAtThreeTimesCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	capacity := float64(workers) / service.Seconds() // 800/s
	const loadTime = 1500 * time.Millisecond

	for _, mode := range []string{"gradient", "codel"} {
		t.Run(mode, func(t *testing.T) {
			s, cli := startServer(t, mode, kernrpc.FilterConfig{Name: answerClockName, Side: "server"},
				kernrpc.FilterConfig{Name: overload.Name, Side: "server", Options: map[string]any{"mode": mode}})
			clock, _ := kernrpc.FindPlugin[*answerClock](s.srv.Plugins(), answerClockName)
			// Unloaded: a third of capacity, which also lets the filter
			// learn the latency of an idle server.
			base, _, other := split(offer(cli, capacity/3, time.Second))
			if len(other) > 0 || len(base) == 0 {
				t.Fatalf("unloaded: calls failed: %v", other)
			}
			p99Unloaded := pct(base, 0.99)
			_, baseAtServer := clock.take(0)
			p99UnloadedAtServer := pct(baseAtServer, 0.99)

			ran0, held0 := s.ran.Load(), s.held.Load()
			start := time.Now()
			rs := offer(cli, 3*capacity, loadTime)
			wall := time.Since(start)
			ok, rejected, other := split(rs)
			atServer, servedAtServer := clock.take(len(rejected))
			ran, held := s.ran.Load()-ran0, s.held.Load()-held0
			// The capacity the handler really had: a sleep of 20ms takes a
			// little longer on a busy machine.
			effective := float64(workers) / (time.Duration(held / max(ran, 1))).Seconds()
			// Goodput over the load's span: calls served while calls were
			// being offered (the last ones end up to one service later).
			goodput := float64(len(ok)) / wall.Seconds()
			p99 := pct(ok, 0.99)
			t.Logf("unloaded (%.0f/s): %d calls, p50 %v, p99 %v", capacity/3, len(base), pct(base, 0.5), p99Unloaded)
			t.Logf("3× capacity (%.0f/s offered for %v, %d calls): %d served, %d rejected, other %v", 3*capacity, loadTime, len(rs), len(ok), len(rejected), other)
			t.Logf("goodput %.0f/s over %v = %.0f%% of nominal capacity %.0f/s, %.0f%% of the effective %.0f/s (mean hold %v)",
				goodput, wall.Round(time.Millisecond), 100*goodput/capacity, capacity, 100*goodput/effective, effective, time.Duration(held/max(ran, 1)))
			t.Logf("admitted: p50 %v, p99 %v = %.2f× unloaded p99", pct(ok, 0.5), p99, float64(p99)/float64(p99Unloaded))
			p99AtServer := pct(servedAtServer, 0.99)
			t.Logf("admitted, at the server (admission to answer written): p50 %v, p99 %v = %.2f× its unloaded p99 %v",
				pct(servedAtServer, 0.5), p99AtServer, float64(p99AtServer)/float64(p99UnloadedAtServer), p99UnloadedAtServer)
			t.Logf("rejections answered (client-observed): p50 %v, p90 %v, p99 %v, max %v",
				pct(rejected, 0.5), pct(rejected, 0.9), pct(rejected, 0.99), pct(rejected, 1))
			t.Logf("rejections answered (at the server, admission to answer written, %d): p50 %v, p90 %v, p99 %v, max %v",
				len(atServer), pct(atServer, 0.5), pct(atServer, 0.9), pct(atServer, 0.99), pct(atServer, 1))
			if len(other) > 0 {
				t.Errorf("calls failed other than by rejection: %v; one: %v", other, firstOther)
			}
			if goodput < 0.9*effective {
				t.Errorf("goodput %.0f/s, under 90%% of the handler's capacity %.0f/s", goodput, effective)
			}
			// Mode codel admits calls that wait for a slot, up to about the
			// target and, while the delay has not stood for an interval,
			// longer: its admitted latency is reported, not held to 3×.
			// Gradient's is held to 3× at the server, where a queue would
			// show: without the filter calls sent 100ms into the overload
			// take 117ms at the median (governance.md), those at its end
			// 2s. What the client sees is logged: 1.6–2.4× quiet, but up
			// to 6.6× beside a fuzzing run, its own goroutines' scheduling.
			if mode == "gradient" && p99AtServer > 3*p99UnloadedAtServer {
				t.Errorf("admitted p99 at the server %v, over 3× its unloaded p99 %v", p99AtServer, p99UnloadedAtServer)
			}
			if len(rejected) < len(rs)/3 {
				t.Errorf("only %d of %d calls rejected at 3× capacity", len(rejected), len(rs))
			}
			// Answered at once: the server's median, from admission to the
			// answer written, is held to 1ms (quiet runs: 6µs; beside a
			// fuzzing run under -race, 31µs); a rejection that waited for
			// a worker would take the 20ms service. Admit's rejection
			// itself costs under 1µs (BenchmarkReject). What the client
			// sees is logged: 90–160µs median quiet, 0.2–1.1ms p90 and
			// 3–12ms p99, its own goroutine scheduling on a shared 2-core
			// machine running 2400 client goroutines a second, and up to
			// 5.6ms median beside a fuzzing run. Every rejection must have
			// reached CallEnded.
			if len(atServer) != len(rejected) {
				t.Errorf("the server's CallEnded saw %d rejections, the client %d", len(atServer), len(rejected))
			}
			if p50 := pct(atServer, 0.5); p50 > time.Millisecond {
				t.Errorf("median rejection answered at the server in %v, over 1ms", p50)
			}
		})
	}

	t.Run("without", func(t *testing.T) {
		_, cli := startServer(t, "without")
		base, _, _ := split(offer(cli, capacity/3, time.Second))
		p99Unloaded := pct(base, 0.99)
		rs := offer(cli, 3*capacity, time.Second)
		ok, rejected, other := split(rs)
		var first, last []time.Duration
		for _, r := range rs {
			switch {
			case r.sent < 100*time.Millisecond:
				first = append(first, r.took)
			case r.sent > 900*time.Millisecond:
				last = append(last, r.took)
			}
		}
		t.Logf("without overload, 3× capacity for 1s (%d calls): %d served, %d rejected, other %v; unloaded p99 %v", len(rs), len(ok), len(rejected), other, p99Unloaded)
		t.Logf("latency of calls sent in the first 100ms: p50 %v; in the last 100ms: p50 %v; p99 of all %v",
			pct(first, 0.5), pct(last, 0.5), pct(ok, 0.99))
		if pct(last, 0.5) < 10*pct(first, 0.5) {
			t.Errorf("latency did not grow with the queue: %v then %v", pct(first, 0.5), pct(last, 0.5))
		}
	})
}
