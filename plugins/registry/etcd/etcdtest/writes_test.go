package etcdtest

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// TestMovingLargeInstancesToALongerLease: instances whose values together
// exceed what etcd takes in one request (1.5 MiB by default), each of which
// etcd took alone, move to a new lease all the same when a Register asks
// for a longer ttl (and so when they are registered again after a lost
// lease): the puts of one transaction stay within etcd's limit.
func TestMovingLargeInstancesToALongerLease(t *testing.T) {
	t.Parallel()
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	r := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	big := strings.Repeat("x", 600<<10)
	for _, id := range []string{"a", "b", "c"} {
		in := instance("echo", id)
		in.Metadata["blob"] = big
		if err := r.Register(ctx, in, time.Second); err != nil {
			t.Fatalf("Register %s: %v", id, err)
		}
	}
	if err := r.Register(ctx, instance("echo", "d"), 3*time.Second); err != nil {
		t.Fatalf("Register with a longer ttl, moving every instance to a new lease: %v", err)
	}
	checkOneLease(t, cli, keys(t, cli, testPrefix(t)), testPrefix(t), 4)
}

// A load report JSON cannot carry (a QPS of NaN or ±Inf) is refused, and
// leaves the instance as it was: kept, it would make every later write of
// all the registry's instances fail (a longer lease, a re-registration
// after a lost lease), not only the report.
func TestAnUnencodableLoadReportIsRefusedAndKeptOut(t *testing.T) {
	t.Parallel()
	srv := Start(t)
	r := open(t, srv.Endpoint(), map[string]any{"load_report_interval": "50ms"})
	ctx := ctxFor(t)
	a := instance("echo", "a")
	if err := r.Register(ctx, a, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, qps := range []float64{math.NaN(), math.Inf(1)} {
		if err := r.ReportLoad(ctx, a, kernel.Load{InFlight: 1, QPS: qps}); err == nil {
			t.Errorf("ReportLoad with QPS %v: nil error; want it refused", qps)
		}
	}
	if err := r.Register(ctx, instance("echo", "b"), 3*time.Second); err != nil {
		t.Fatalf("Register with a longer ttl, after a refused load report: %v", err)
	}
	resolveUntil(t, r, "echo", []string{"a", "b"}, 5*time.Second, "after registering b")
}
