package prometheus

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/kernrpc/kernrpc/kernel"
)

// The plugins' own figures (kernel.StateReporter: a breaker's state, a
// token bucket's level, the engine's connections) are read at each
// scrape and exposed as kernrpc_<reading name>. Nothing is added to a
// call: the plugins keep their figures anyway.
//
// One stateSet serves a registry. With registry: own that is one filter's;
// with registry: default every filter of the process adds its plugins to
// the same set, so that a series two of them report alike (two Clients of
// one service, say) is added up into one, as the call metrics are, rather
// than collected twice, which would fail the scrape.

var _ kernel.PluginsObserver = (*Filter)(nil)

// labelSide is the label added to every plugin's readings: the side of
// the Server or Client that built the plugin, so that a token bucket on
// each side of one process (registry: default) shows as two series. The
// engine's readings have it in their names (server_..., client_...).
const labelSide = "side"

// panicsName is the family that counts reports that panicked. Its
// collector is the one described, so that a second filter registering the
// set in the same registry finds the first one's.
const panicsName = "kernrpc_state_report_panics_total"

var panicsDesc = prom.NewDesc(panicsName, "Reports of a plugin's state that panicked and whose readings the scrape left out.", nil, nil)

// stateSet is the reporters a registry's scrapes read, by the filter that
// observed them.
type stateSet struct {
	mu     sync.Mutex
	groups map[*Filter]*reporterGroup

	descMu sync.Mutex
	descs  map[string]*readingDesc // by reading name

	panics atomic.Uint64
}

// reporterGroup is the reporters of one Server or Client.
type reporterGroup struct {
	side      string // "client" or "server"
	reporters []*reporter
}

type reporter struct {
	kind   kernel.Kind
	name   string
	r      kernel.StateReporter
	warned atomic.Bool // its panic was logged
}

// readingDesc is the family of one reading name, fixed by its first
// reading: kind, label names, help.
type readingDesc struct {
	desc   *prom.Desc
	kind   kernel.ReadingKind
	labels []string // the reading's, then labelSide for a plugin's
	bad    string   // why readings of this name are left out; "" if they are not
	warned bool     // a reading that did not fit was logged
}

// ownFamily reports whether name is one the filter registers itself: a
// reading of that name would clash with the call metrics.
func ownFamily(name string) bool {
	if name == panicsName {
		return true
	}
	rest, ok := strings.CutPrefix(name, "kernrpc_client_")
	if !ok {
		rest, ok = strings.CutPrefix(name, "kernrpc_server_")
	}
	switch rest {
	case "calls_total", "call_duration_seconds", "calls_in_flight", "request_bytes_total", "response_bytes_total", "attempts_total",
		"streams_started_total", "streams_ended_total", "streams_in_flight", "stream_messages_sent_total", "stream_messages_received_total":
		return ok
	}
	return false
}

// stateAnchor is the described collector of a set: it counts the panics,
// and registering a second one in a registry returns the first.
type stateAnchor struct{ set *stateSet }

func (a *stateAnchor) Describe(ch chan<- *prom.Desc) { ch <- panicsDesc }
func (a *stateAnchor) Collect(ch chan<- prom.Metric) {
	ch <- prom.MustNewConstMetric(panicsDesc, prom.CounterValue, float64(a.set.panics.Load()))
}

// stateCollector is unchecked (it describes nothing): the families it
// collects are known only once the plugins report.
type stateCollector struct{ set *stateSet }

func (c *stateCollector) Describe(chan<- *prom.Desc)    {}
func (c *stateCollector) Collect(ch chan<- prom.Metric) { c.set.collect(ch) }

// registerState registers a registry's state collectors, or finds the
// set another filter registered there.
func registerState(reg prom.Registerer) (*stateSet, error) {
	a := &stateAnchor{set: &stateSet{groups: map[*Filter]*reporterGroup{}, descs: map[string]*readingDesc{}}}
	if err := reg.Register(a); err != nil {
		var are prom.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*stateAnchor); ok {
				return existing.set, nil
			}
		}
		return nil, fmt.Errorf("registering the plugins' state collector: %w", err)
	}
	if err := reg.Register(&stateCollector{set: a.set}); err != nil {
		reg.Unregister(a)
		return nil, fmt.Errorf("registering the plugins' state collector: %w", err)
	}
	return a.set, nil
}

// ObservePlugins keeps the plugins that report their state (the engine's
// own reporter among them), to read at each scrape.
func (f *Filter) ObservePlugins(refs []kernel.PluginRef) {
	g := &reporterGroup{side: sideOf(f, refs)}
	for _, ref := range refs {
		if ref.Plugin == any(f) {
			continue
		}
		if r, ok := ref.Plugin.(kernel.StateReporter); ok {
			g.reporters = append(g.reporters, &reporter{kind: ref.Kind, name: ref.Name, r: r})
		}
	}
	f.state.mu.Lock()
	defer f.state.mu.Unlock()
	if f.stateClosed {
		return
	}
	f.state.groups[f] = g // observed again: the new list replaces the old
}

// forget drops f's reporters: a closed Server's or Client's plugins are
// not read again, nor kept alive by the registry.
func (s *stateSet) forget(f *Filter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.stateClosed = true
	delete(s.groups, f)
}

// sideOf is the side of the Server or Client whose plugins refs are, as
// the engine says it in each PluginRef: this filter's own ref's, which is
// among them, or else the first's.
func sideOf(f *Filter, refs []kernel.PluginRef) string {
	for _, ref := range refs {
		if ref.Plugin == any(f) {
			return ref.Side.String()
		}
	}
	if len(refs) > 0 {
		return refs[0].Side.String()
	}
	return ""
}

// series is one series of a scrape, its value summed over the reporters
// that report it.
type series struct {
	d      *readingDesc
	values []string
	value  float64
}

// collect reads every reporter and sends one const metric per series.
func (s *stateSet) collect(ch chan<- prom.Metric) {
	s.mu.Lock()
	groups := make([]*reporterGroup, 0, len(s.groups))
	for _, g := range s.groups {
		groups = append(groups, g)
	}
	s.mu.Unlock()

	all := map[string]*series{}
	var key []byte
	var readings []kernel.Reading
	for _, g := range groups {
		for _, rep := range g.reporters {
			side := g.side
			if rep.kind == kernel.KindEngine {
				side = ""
			}
			var ok bool
			if readings, ok = s.report(rep, readings[:0]); !ok {
				continue
			}
			for _, r := range readings {
				d := s.descFor(r, side)
				if d == nil {
					continue
				}
				// The key is of the values as exposed (made valid UTF-8),
				// so that readings the page would show alike are added up
				// rather than fail the scrape; 0xff, never in valid UTF-8,
				// parts them, so that no value runs into the next.
				key = append(key[:0], r.Name...)
				for _, l := range r.Labels {
					key = append(append(key, 0xff), validLabel(l.Value)...)
				}
				key = append(append(key, 0xff), side...)
				if sr := all[string(key)]; sr != nil {
					sr.value += r.Value
					continue
				}
				all[string(key)] = &series{d: d, values: labelValues(r.Labels, side), value: r.Value}
			}
		}
	}
	for _, sr := range all {
		vt := prom.GaugeValue
		if sr.d.kind == kernel.Counter {
			vt = prom.CounterValue
		}
		m, err := prom.NewConstMetric(sr.d.desc, vt, sr.value, sr.values...)
		if err != nil { // the values were made valid: not expected
			slog.Warn("prometheus: a plugin's reading is left out of the scrape", "metric", sr.d.desc.String(), "err", err)
			continue
		}
		ch <- m
	}
}

// report runs one reporter, appending its readings to buf; ok is false
// if it panicked: a reporter that panics loses its readings for that
// scrape, not the scrape.
func (s *stateSet) report(rep *reporter, buf []kernel.Reading) (out []kernel.Reading, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			out, ok = buf, false
			s.panics.Add(1)
			if !rep.warned.Swap(true) {
				slog.Warn("prometheus: a plugin's ReportState panicked; its readings are left out of the scrapes it panics in (logged once)",
					"kind", rep.kind, "plugin", rep.name, "panic", v)
			}
		}
	}()
	out = buf
	rep.r.ReportState(func(r kernel.Reading) { out = append(out, r) })
	return out, true
}

func labelValues(labels []kernel.Label, side string) []string {
	vs := make([]string, 0, len(labels)+1)
	for _, l := range labels {
		vs = append(vs, validLabel(l.Value))
	}
	if side != "" {
		vs = append(vs, side)
	}
	return vs
}

// validLabel is v as a label value: valid UTF-8, invalid bytes (a method
// name off the wire, say) made U+FFFD.
func validLabel(v string) string {
	if utf8.ValidString(v) {
		return v
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// descFor is the family of r, made from its first reading; nil, logged
// once, when r does not fit it or its name cannot be exposed.
func (s *stateSet) descFor(r kernel.Reading, side string) *readingDesc {
	s.descMu.Lock()
	defer s.descMu.Unlock()
	d, ok := s.descs[r.Name]
	if !ok {
		d = newReadingDesc(r, side)
		s.descs[r.Name] = d
		if d.bad != "" {
			slog.Warn("prometheus: a plugin's readings are left out of the scrapes", "reading", r.Name, "why", d.bad)
		}
	}
	if d.bad != "" {
		return nil
	}
	if !d.fits(r, side) {
		if !d.warned {
			d.warned = true
			slog.Warn("prometheus: a reading is left out of the scrapes: its kind or label names differ from the first reading of its name (logged once)",
				"reading", r.Name, "labels", d.labels)
		}
		return nil
	}
	return d
}

func newReadingDesc(r kernel.Reading, side string) *readingDesc {
	d := &readingDesc{kind: r.Kind}
	for _, l := range r.Labels {
		d.labels = append(d.labels, l.Name)
	}
	if side != "" {
		d.labels = append(d.labels, labelSide)
	}
	name := "kernrpc_" + r.Name
	switch {
	case r.Kind != kernel.Gauge && r.Kind != kernel.Counter:
		d.bad = fmt.Sprintf("kind %d is neither Gauge nor Counter", r.Kind)
		return d
	case ownFamily(name):
		d.bad = name + " is one of the filter's own families"
		return d
	case !model.LegacyValidation.IsValidMetricName(name):
		// Valid UTF-8 names would pass, but be escaped on the page for
		// most scrapers: a dashboard would not find them by their name.
		d.bad = name + " is not a metric name of [a-zA-Z_:][a-zA-Z0-9_:]*"
		return d
	}
	for _, l := range d.labels {
		if !model.LegacyValidation.IsValidLabelName(l) {
			d.bad = fmt.Sprintf("label %q is not a label name of [a-zA-Z_][a-zA-Z0-9_]*", l)
			return d
		}
	}
	help := r.Help
	if help == "" {
		help = "Reported by the plugin " + r.Name + " came from, without help." // promtool wants some
	}
	d.desc = prom.NewDesc(name, help, d.labels, nil)
	// A label named twice (or "side" by a plugin) is in the desc's error,
	// which NewConstMetric returns.
	if _, err := prom.NewConstMetric(d.desc, prom.GaugeValue, 0, make([]string, len(d.labels))...); err != nil {
		d.bad = err.Error()
	}
	return d
}

// fits reports whether r belongs to the family d.
func (d *readingDesc) fits(r kernel.Reading, side string) bool {
	n := len(r.Labels)
	if side != "" {
		n++
	}
	if r.Kind != d.kind || n != len(d.labels) {
		return false
	}
	for i, l := range r.Labels {
		if l.Name != d.labels[i] {
			return false
		}
	}
	return true
}
