package prometheus_test

import (
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// reporter is a plugin that reports fixed readings, or panics.
type reporter struct {
	readings []kernel.Reading
	panics   bool
	calls    atomic.Int64
}

func (r *reporter) ReportState(emit func(kernel.Reading)) {
	r.calls.Add(1)
	for _, rd := range r.readings {
		emit(rd)
	}
	if r.panics {
		panic("reporter broken")
	}
}

func gauge(name string, v float64, labels ...string) kernel.Reading {
	rd := kernel.Reading{Name: name, Help: "A test figure.", Kind: kernel.Gauge, Value: v}
	for i := 0; i+1 < len(labels); i += 2 {
		rd.Labels = append(rd.Labels, kernel.Label{Name: labels[i], Value: labels[i+1]})
	}
	return rd
}

func counter(name string, v float64, labels ...string) kernel.Reading {
	rd := gauge(name, v, labels...)
	rd.Kind = kernel.Counter
	return rd
}

// Readings become kernrpc_ families of their kind, a plugin's with the
// side label (the side its PluginRef says) and the engine's
// without; a series two plugins report alike is added up; a panicking
// reporter loses its own readings, not the scrape, and is counted;
// readings that do not fit their family, or cannot be exposed, are left
// out; the filter does not read itself; the page passes promtool.
func TestReadingsBecomeMetrics(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	good := &reporter{readings: []kernel.Reading{
		gauge("test_level", 3, "bucket", "a"),
		counter("test_hits_total", 5, "bucket", "a"),
		gauge("test_level", 4, "other_label", "x"),       // labels differ from the first: left out
		counter("test_level", 1, "bucket", "b"),          // kind differs: left out
		gauge("bad name!", 1),                            // cannot be exposed
		gauge("test_bad_label", 1, "bad-label", "x"),     // cannot be exposed
		gauge("test_side", 1, "side", "mine"),            // side is the filter's label
		counter("client_calls_total", 1, "service", "x"), // the filter's own family
		gauge("test_utf8", 1, "method", "Echo.\xff"),     // made valid
	}}
	twin := &reporter{readings: []kernel.Reading{gauge("test_level", 2, "bucket", "a"), counter("test_hits_total", 1, "bucket", "b")}}
	broken := &reporter{readings: []kernel.Reading{gauge("test_broken", 1)}, panics: true}
	engine := &reporter{readings: []kernel.Reading{gauge("client_connections_open", 7, "service", "echo")}}
	f.ObservePlugins([]kernel.PluginRef{
		{Kind: kernel.KindBalancer, Name: "round-robin", Side: kernel.ClientSide, Plugin: struct{}{}},
		{Kind: kernel.KindFilter, Name: "good", Side: kernel.ClientSide, Plugin: good},
		{Kind: kernel.KindFilter, Name: "twin", Side: kernel.ClientSide, Plugin: twin},
		{Kind: kernel.KindFilter, Name: "broken", Side: kernel.ClientSide, Plugin: broken},
		{Kind: kernel.KindFilter, Name: "prometheus", Side: kernel.ClientSide, Plugin: f},
		{Kind: kernel.KindEngine, Name: "kernrpc", Side: kernel.ClientSide, Plugin: engine},
	})
	url := serve(t, f.Handler())
	body, fams := scrape(t, url)
	promtool(t, body)

	if got := value(t, fams, "kernrpc_test_level", labels{"bucket": "a", "side": "client"}); got != 5 {
		t.Errorf("test_level of bucket a, reported 3 and 2: %g, want them added up", got)
	}
	if n := len(fams["kernrpc_test_level"].GetMetric()); n != 1 {
		t.Errorf("%d test_level series, want 1: the readings that did not fit are left out", n)
	}
	if fams["kernrpc_test_level"].GetType().String() != "GAUGE" || fams["kernrpc_test_hits_total"].GetType().String() != "COUNTER" {
		t.Errorf("types %v, %v; want gauge, counter", fams["kernrpc_test_level"].GetType(), fams["kernrpc_test_hits_total"].GetType())
	}
	for bucket, want := range map[string]float64{"a": 5, "b": 1} {
		if got := value(t, fams, "kernrpc_test_hits_total", labels{"bucket": bucket}); got != want {
			t.Errorf("test_hits_total of %s: %g, want %g", bucket, got, want)
		}
	}
	if got := value(t, fams, "kernrpc_test_utf8", labels{"method": "Echo.\uFFFD"}); got != 1 {
		t.Errorf("test_utf8 = %g", got)
	}
	if got := value(t, fams, "kernrpc_client_connections_open", labels{"service": "echo"}); got != 7 {
		t.Errorf("the engine's reading: %g, want 7", got)
	}
	for _, l := range series(t, fams, "kernrpc_client_connections_open", labels{}).GetLabel() {
		if l.GetName() == "side" {
			t.Error("the engine's reading has a side label: its name says the side")
		}
	}
	for _, name := range []string{"kernrpc_test_broken", "kernrpc_bad_name_", "kernrpc_test_bad_label", "kernrpc_test_side", "kernrpc_client_calls_total"} {
		if _, ok := fams[name]; ok {
			t.Errorf("%s is on the page", name)
		}
	}
	// The panic count is read beside the reporters, so it shows by the
	// next scrape.
	_, fams = scrape(t, url)
	if got := value(t, fams, "kernrpc_state_report_panics_total", labels{}); got < 1 {
		t.Errorf("kernrpc_state_report_panics_total = %g after two scrapes with a panicking reporter", got)
	}
	if broken.calls.Load() != 2 || good.calls.Load() != 2 {
		t.Errorf("reporters called %d and %d times in two scrapes, want 2 each", broken.calls.Load(), good.calls.Load())
	}

	// The side is the one the refs say, not guessed from their kinds: a
	// server's list with a balancer in it (the old guess said client)
	// is the server's. Observed again, the new list replaces the old.
	f.ObservePlugins([]kernel.PluginRef{
		{Kind: kernel.KindBalancer, Name: "round-robin", Side: kernel.ServerSide, Plugin: struct{}{}},
		{Kind: kernel.KindFilter, Name: "good", Side: kernel.ServerSide, Plugin: &reporter{readings: []kernel.Reading{gauge("test_level", 1, "bucket", "a")}}},
		{Kind: kernel.KindFilter, Name: "prometheus", Side: kernel.ServerSide, Plugin: f},
	})
	_, fams = scrape(t, url)
	if got := value(t, fams, "kernrpc_test_level", labels{"side": "server"}); got != 1 {
		t.Errorf("test_level on the server side: %g", got)
	}
	if _, ok := fams["kernrpc_test_hits_total"]; ok {
		t.Error("the plugins of the first list are still read")
	}
	// Without the filter's own ref (a host that leaves it out), the
	// first ref's side stands.
	f.ObservePlugins([]kernel.PluginRef{{Kind: kernel.KindFilter, Name: "good", Side: kernel.ClientSide, Plugin: &reporter{readings: []kernel.Reading{gauge("test_level", 2, "bucket", "a")}}}})
	_, fams = scrape(t, url)
	if got := value(t, fams, "kernrpc_test_level", labels{"side": "client"}); got != 2 {
		t.Errorf("test_level on the client side, with no ref of the filter: %g", got)
	}

	// Closed, the filter reads no plugin, now or when observed later.
	_ = f.Close()
	f.ObservePlugins([]kernel.PluginRef{{Kind: kernel.KindFilter, Name: "good", Plugin: good}})
	_, fams = scrape(t, url)
	if _, ok := fams["kernrpc_test_level"]; ok {
		t.Error("a closed filter's plugins are still read")
	}
}

// Readings whose label values differ only in bytes that are not UTF-8
// (method names off the wire) become the same series once their values
// are made valid: they are added up, not collected twice, which would
// fail the scrape. Nor do values holding the key's separator run into
// each other.
func TestReadingsAlikeOnceMadeValid(t *testing.T) {
	f := build(t, map[string]any{"go_metrics": false, "process_metrics": false})
	r := &reporter{readings: []kernel.Reading{
		gauge("test_utf8", 1, "method", "Echo.\xff"),
		gauge("test_utf8", 2, "method", "Echo.\xfe"),
		gauge("test_pair", 1, "a", "x\x00y", "b", "z"),
		gauge("test_pair", 2, "a", "x", "b", "y\x00z"),
	}}
	f.ObservePlugins([]kernel.PluginRef{{Kind: kernel.KindFilter, Name: "r", Side: kernel.ServerSide, Plugin: r}})
	_, fams := scrape(t, serve(t, f.Handler()))
	if got := value(t, fams, "kernrpc_test_utf8", labels{"method": "Echo.\uFFFD", "side": "server"}); got != 3 {
		t.Errorf("test_utf8 = %g, want the two readings added up (3)", got)
	}
	if got := value(t, fams, "kernrpc_test_pair", labels{"a": "x", "b": "y\x00z"}); got != 2 {
		t.Errorf("test_pair{a=x, b=y\\0z} = %g, want 2", got)
	}
}
