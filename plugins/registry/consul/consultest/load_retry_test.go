package consultest_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// A load report held for the end of the interval whose write then fails
// (the agent away for a moment) is written once the agent is back, at the
// next interval: the server reports a load only when it changes, so a
// report dropped here would leave the old load published for as long as
// the server's load stays as it is.
func TestAHeldLoadReportWhoseWriteFailedIsWrittenLater(t *testing.T) {
	logs := enginetest.DefaultLog(t) // before open: the registry keeps slog.Default's logger
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"ttl": "1m", "timeout": "500ms", "load_report_interval": "300ms"})
	in := instance("echo", "a")
	if err := r.Register(ctx(t), in, 0); err != nil {
		t.Fatal(err)
	}
	first := kernel.Load{InFlight: 1, QPS: 10}
	if err := r.ReportLoad(ctx(t), in, first); err != nil { // written at once: none was yet
		t.Fatal(err)
	}
	second := kernel.Load{InFlight: 2, QPS: 20}
	if err := r.ReportLoad(ctx(t), in, second); err != nil { // held for the end of the interval
		t.Fatal(err)
	}
	s.Stop()
	const failed = `msg="consul: writing a load report failed`
	eventually(t, 10*time.Second, "the held report's write failed", func() bool { return strings.Contains(logs.String(), failed) })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	observer := open(t, s.Addr(), nil)
	var got []kernel.Instance
	deadline := time.Now().Add(10 * time.Second)
	for {
		set, err := observer.Resolve(ctx(t), "echo")
		if err == nil && len(set) == 1 && set[0].Load.InFlight == second.InFlight && set[0].Load.QPS == second.QPS {
			return
		}
		got = set
		if time.Now().After(deadline) {
			t.Fatalf("10s after the agent came back, with no report since, the instance resolves as %+v (err %v); want the load reported last, %+v", got, err, second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A load report JSON cannot carry (a QPS of NaN or ±Inf) is refused, also
// when it would be held for the end of the interval: there its write would
// fail, again at every interval, after ReportLoad said nil.
func TestAnUnencodableLoadReportIsRefused(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"load_report_interval": "1m"})
	in := instance("echo", "a")
	if err := r.Register(ctx(t), in, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.ReportLoad(ctx(t), in, kernel.Load{InFlight: 1, QPS: 10}); err != nil { // written at once
		t.Fatal(err)
	}
	for _, qps := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if err := r.ReportLoad(ctx(t), in, kernel.Load{InFlight: 2, QPS: qps}); err == nil {
			t.Errorf("ReportLoad with QPS %v: nil error; want it refused", qps)
		}
	}
}
