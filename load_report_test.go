package kernrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// flakyLoads is a memory registry whose first load reports fail.
type flakyLoads struct {
	*memory.Registry
	failures atomic.Int32 // reports still to fail
	reported atomic.Int32 // reports that went through
}

func (r *flakyLoads) ReportLoad(ctx context.Context, in kernel.Instance, l kernel.Load) error {
	if r.failures.Add(-1) >= 0 {
		return errors.New("registry briefly unreachable")
	}
	r.reported.Add(1)
	return r.Registry.ReportLoad(ctx, in, l)
}

func init() {
	registerWrapped("test-flaky-loads", func(r *memory.Registry) kernel.Registry {
		f := &flakyLoads{Registry: r}
		f.failures.Store(2)
		return f
	})
}

// heldCall serves Echo.Hold, which answers only once the test ends: a call
// held in flight is a load unlike the idle one, which is never written.
type heldCall struct {
	release chan struct{}
	done    chan error
}

func newHeldCall() *heldCall {
	return &heldCall{release: make(chan struct{}), done: make(chan error, 1)}
}

func (h *heldCall) register(s *kernrpc.Server) {
	kernrpc.Handle(s, "Echo.Hold", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		<-h.release
		return req, nil
	})
}

// start makes the call through cli; it is answered when t ends.
func (h *heldCall) start(t *testing.T, cli *kernrpc.Client) {
	go func() { h.done <- cli.Call(context.Background(), "Echo.Hold", &echopb.Echo{}, &echopb.Echo{}) }()
	t.Cleanup(func() { close(h.release); <-h.done })
}

// A load report the registry refuses is logged at WARN and tried again at
// the next interval, even though the load has not changed since.
func TestFailedLoadReportIsRetried(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Registry.Name = "test-flaky-loads"
	cfg.Server.LoadReportInterval = kernel.Duration(10 * time.Millisecond)
	held := newHeldCall()
	srv := startServer(t, cfg, held.register)
	reg, _ := kernrpc.FindPlugin[*flakyLoads](srv.Plugins(), "test-flaky-loads")
	held.start(t, newClient(t, cfg))
	if !eventually(5*time.Second, func() bool { return reg.reported.Load() > 0 }) {
		t.Fatal("no load report went through after the first two failed")
	}
	if n := strings.Count(logs.String(), `level=WARN msg="load report failed; trying again at the next interval" component=kernrpc.server service=echo registry=test-flaky-loads err="registry briefly unreachable"`); n != 2 {
		t.Errorf("%d WARN lines for the two failed reports, want 2:\n%s", n, logs.String())
	}
}

// The console's instances view shows the load each instance reported:
// here one call held in flight, and when it was written.
func TestConsoleShowsReportedLoad(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	cfg.Server.LoadReportInterval = kernel.Duration(10 * time.Millisecond)
	held := newHeldCall()
	srv := startServer(t, cfg, held.register)
	held.start(t, newClient(t, cfg))
	// The registry has the report before the console is asked: it keeps
	// what it resolved for a while.
	if !eventually(5*time.Second, func() bool {
		in := resolveOf(t, cfg, "echo")
		return len(in) == 1 && in[0].Load.InFlight == 1
	}) {
		t.Fatal("no load report of the call in flight reached the registry")
	}
	var view struct {
		Instances []struct {
			ID       string     `json:"id"`
			InFlight int64      `json:"load_in_flight"`
			Updated  *time.Time `json:"load_updated"`
		} `json:"instances"`
	}
	getJSON(t, "http://"+srv.AdminAddr()+"/status/instances.json", &view)
	if len(view.Instances) != 1 || view.Instances[0].ID != srv.Instance().ID || view.Instances[0].Updated == nil {
		t.Fatalf("instances.json: %+v; want this server with the time of its load report", view.Instances)
	}
	if got := view.Instances[0]; got.InFlight != 1 || time.Since(*got.Updated) > time.Minute {
		t.Errorf("instances.json: %d in flight, reported at %v; want the call held, reported just now", got.InFlight, got.Updated)
	}
}

// An instance taken out of the registry (NOT_SERVING) and put back
// (SERVING) is registered anew, without its load: the load reporter must
// write the load again, even though it has not changed since.
func TestLoadIsReportedAgainAfterTheInstanceIsRegisteredAgain(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.LoadReportInterval = kernel.Duration(10 * time.Millisecond)
	held := newHeldCall()
	srv := startServer(t, cfg, held.register)
	held.start(t, newClient(t, cfg))
	inflightOne := func() bool {
		in := resolveOf(t, cfg, "echo")
		return len(in) == 1 && in[0].Load.InFlight == 1
	}
	if !eventually(5*time.Second, inflightOne) {
		t.Fatal("no load report of the call in flight reached the registry")
	}
	ctx := context.Background()
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthNotServing); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * cfg.Server.LoadReportInterval.D()) // ticks while out of the registry
	if err := srv.SetServingStatus(ctx, "", kernrpc.HealthServing); err != nil {
		t.Fatal(err)
	}
	if !eventually(2*time.Second, inflightOne) {
		in := resolveOf(t, cfg, "echo")
		t.Fatalf("registered again with one call still in flight, the registry shows %+v; want InFlight 1", in)
	}
}

// slowLoads is a memory registry whose first load report waits until the
// test lets it through; every report's load is handed to the test.
type slowLoads struct {
	*memory.Registry
	entered chan struct{} // closed once the first report is being written
	gate    chan struct{} // closed by the test to let the first report through
	loads   chan kernel.Load
	first   atomic.Bool
}

func (r *slowLoads) ReportLoad(ctx context.Context, in kernel.Instance, l kernel.Load) error {
	if r.first.CompareAndSwap(false, true) {
		close(r.entered)
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case r.loads <- l:
	default:
	}
	return r.Registry.ReportLoad(ctx, in, l)
}

func init() {
	registerWrapped("test-slow-loads", func(r *memory.Registry) kernel.Registry {
		return &slowLoads{Registry: r, entered: make(chan struct{}), gate: make(chan struct{}), loads: make(chan kernel.Load, 16)}
	})
}

// A load report that the registry took several intervals to write does
// not make the next one's QPS count the calls of all those intervals as
// those of one: the QPS is over the time that really passed.
func TestQPSAfterASlowLoadReportCountsTheTimeThatPassed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Registry.Name = "test-slow-loads"
	cfg.Server.LoadReportInterval = kernel.Duration(10 * time.Millisecond)
	held := newHeldCall()
	srv := startServer(t, cfg, held.register)
	reg, _ := kernrpc.FindPlugin[*slowLoads](srv.Plugins(), "test-slow-loads")
	cli := newClient(t, cfg)
	held.start(t, cli)
	receive(t, reg.entered, 5*time.Second, "no load report of the call in flight")
	// The reporter wrote its last figures before this: whatever QPS it
	// reports next is over at least the time from here to the release.
	since := time.Now()
	const calls = 50
	for range calls {
		if err := cli.Call(t.Context(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // ten intervals the registry holds the write
	window := time.Since(since)
	close(reg.gate)
	receive(t, reg.loads, 5*time.Second, "the held report did not go through") // the held one
	load := receive(t, reg.loads, 5*time.Second, "no report after the held one")
	if most := calls / window.Seconds(); load.QPS > most {
		t.Errorf("QPS %.0f after %d calls in the %v the registry held a report; want at most %.0f (the calls over the time that passed)",
			load.QPS, calls, window.Round(time.Millisecond), most)
	}
}
