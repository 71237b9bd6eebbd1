package etcdtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// TestAHeldLoadReportWhoseWriteFailedIsWrittenLater: a load report held
// for the end of the interval, whose write then fails (etcd out of reach
// for a moment, the lease still alive), is written once etcd answers
// again: the server reports a load only when it changes, so a report
// dropped here would leave the old load published for as long as the
// server's load stays as it is.
func TestAHeldLoadReportWhoseWriteFailedIsWrittenLater(t *testing.T) {
	logs := enginetest.DefaultLog(t) // before open: the registry keeps slog.Default's logger
	h := newHeldReport(t)
	proxy, r, reader, ctx, second, resolveLoad := h.proxy, h.r, h.reader, h.ctx, h.second, h.resolveLoad
	proxy.Cut()
	const failed = `msg="etcd: writing a coalesced load report failed`
	if !within(10*time.Second, func() bool { return strings.Contains(logs.String(), failed) }) {
		t.Fatalf("the held report's write did not fail while etcd was out of reach:\n%s", logs.String())
	}
	proxy.Restore()
	if !within(10*time.Second, resolveLoad(second)) {
		set, err := reader.Resolve(ctx, "echo")
		t.Fatalf("10s after etcd was in reach again, with no report since, the instance resolves as %+v (err %v); want the load reported last, %+v\n%s",
			set, err, second, logs.String())
	}
	if s := r.Stats(); s.Reregistrations != 0 {
		t.Errorf("stats %+v; want no re-registration (which would carry the latest load anyway)", s)
	}
}

// within polls cond every 10ms until it holds (true) or d passes (false).
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestAFailedRegisterAgainKeepsTheHeldLoadReport: a Register of an
// instance already registered that fails (etcd out of reach) leaves the
// instance as it was, its held load report included, which is written
// once etcd answers again.
func TestAFailedRegisterAgainKeepsTheHeldLoadReport(t *testing.T) {
	h := newHeldReport(t)
	proxy, r, reader, ctx, in, second, resolveLoad := h.proxy, h.r, h.reader, h.ctx, h.in, h.second, h.resolveLoad
	proxy.Cut()
	if err := r.Register(ctx, in, 30*time.Second); err == nil {
		t.Fatal("Register with etcd out of reach: nil error")
	}
	proxy.Restore()
	if !within(10*time.Second, resolveLoad(second)) {
		set, err := reader.Resolve(ctx, "echo")
		t.Fatalf("10s after a failed Register again and etcd in reach again, the instance resolves as %+v (err %v); want the load held before, %+v",
			set, err, second)
	}
}

// heldReport is a registry r, through proxy, whose instance in had one
// load report written and a second, second, held for the end of the
// interval; reader resolves straight from etcd, and resolveLoad(want)
// reports whether reader sees want.
type heldReport struct {
	proxy       *cutProxy
	r, reader   *etcd.Registry
	ctx         context.Context
	in          kernel.Instance
	second      kernel.Load
	resolveLoad func(want kernel.Load) func() bool
}

func newHeldReport(t *testing.T) *heldReport {
	t.Helper()
	srv := Start(t)
	h := &heldReport{proxy: startProxy(t, srv.Endpoint()), ctx: ctxFor(t), in: instance("echo", "a")}
	h.r = open(t, h.proxy.Addr(), map[string]any{"dial_timeout": "300ms", "load_report_interval": "500ms"})
	h.reader = open(t, srv.Endpoint(), nil)
	if err := h.r.Register(h.ctx, h.in, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The registration was a write: the first report is held too, and
	// written at the end of the interval.
	first := kernel.Load{InFlight: 1, QPS: 10, Updated: time.Now()}
	if err := h.r.ReportLoad(h.ctx, h.in, first); err != nil {
		t.Fatal(err)
	}
	h.resolveLoad = func(want kernel.Load) func() bool {
		return func() bool {
			set, err := h.reader.Resolve(h.ctx, "echo")
			return err == nil && len(set) == 1 && set[0].Load.InFlight == want.InFlight && set[0].Load.QPS == want.QPS
		}
	}
	if !within(10*time.Second, h.resolveLoad(first)) {
		t.Fatal("the first load report did not reach etcd")
	}
	h.second = kernel.Load{InFlight: 2, QPS: 20, Updated: time.Now()}
	if err := h.r.ReportLoad(h.ctx, h.in, h.second); err != nil { // held: the last write was just now
		t.Fatal(err)
	}
	return h
}
