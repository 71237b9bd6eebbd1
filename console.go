package kernrpc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// console is the status console a server serves on its admin address
// (docs/console.md): a page at /status and each of its views as JSON.
// It exists only with server.admin_address; without it no call is
// counted.
type console struct {
	serverStats
	s       *Server
	plugins []pluginView // worked out once: the config does not change

	instMu sync.Mutex // held while resolving, so that page loads do not pile up on the registry
	inst   instancesView
	instAt time.Time
}

// instancesCacheFor is how long the console shows the registry's answer
// before asking again: a page refreshing every second from several tabs
// costs the registry one Resolve per this period.
const instancesCacheFor = 2 * time.Second

// resolveTimeout bounds one Resolve for the console.
const resolveTimeout = 2 * time.Second

// consoleViews are the JSON views, by their path under /status/.
var consoleViews = []struct{ path, doc string }{
	{"summary.json", "the server: service, instance, status, calls and connections"},
	{"plugins.json", "the plugins built, with their effective options"},
	{"methods.json", "every method: calls by code, QPS and error rate over 10s, p50/p99 latency"},
	{"connections.json", "open connections: peer, since when, calls in flight"},
	{"state.json", "what the plugins and the engine report of their state (breakers, limiters)"},
	{"instances.json", "the registry's instances of this service, as this process resolves them"},
	{"slowest.json", "the 20 slowest calls of the last minute, with their trace ids"},
}

// mountConsole adds the console's routes to mux and the admin index, and
// starts counting calls. Start calls it once every method is registered.
func (s *Server) mountConsole(mux *http.ServeMux, entries []adminEntry) []adminEntry {
	now := time.Now()
	cn := &console{s: s}
	cn.serverStats.init(s.methods, now)
	cn.plugins = cn.effectivePlugins()
	s.console = cn
	mux.HandleFunc("GET /status", cn.servePage)
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, cn.all(r.Context())) })
	mux.HandleFunc("GET /status/{view}", cn.serveView)
	entries = append(entries,
		adminEntry{"GET /status", "the status console: a page refreshing itself every second", "kernrpc"},
		adminEntry{"GET /status.json", "every view of the console in one JSON document", "kernrpc"})
	for _, v := range consoleViews {
		entries = append(entries, adminEntry{"GET /status/" + v.path, v.doc, "kernrpc"})
	}
	return entries
}

func (cn *console) serveView(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var v any
	switch r.PathValue("view") {
	case "summary.json":
		v = cn.summary(cn.clock())
	case "plugins.json":
		v = cn.plugins
	case "methods.json":
		v = cn.methods(cn.clock())
	case "connections.json":
		v = cn.connections(time.Now())
	case "state.json":
		v = cn.state()
	case "instances.json":
		v = cn.instances(ctx)
	case "slowest.json":
		v = slowViews(cn.slow.list(cn.clock()))
	default:
		names := make([]string, len(consoleViews))
		for i, cv := range consoleViews {
			names[i] = "/status/" + cv.path
		}
		http.Error(w, fmt.Sprintf("no view %q; the console serves /status.json and %s", r.PathValue("view"), strings.Join(names, ", ")), http.StatusNotFound)
		return
	}
	writeJSON(w, v)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// statusView is /status.json: every view at once, which the page reads.
type statusView struct {
	Summary     summaryView   `json:"summary"`
	Plugins     []pluginView  `json:"plugins"`
	Methods     []methodView  `json:"methods"`
	Connections []connView    `json:"connections"`
	State       []stateView   `json:"state"`
	Instances   instancesView `json:"instances"`
	Slowest     []slowView    `json:"slowest"`
}

func (cn *console) all(ctx context.Context) statusView {
	now := cn.clock()
	return statusView{
		Summary:     cn.summary(now),
		Plugins:     cn.plugins,
		Methods:     cn.methods(now),
		Connections: cn.connections(now),
		State:       cn.state(),
		Instances:   cn.instances(ctx),
		Slowest:     slowViews(cn.slow.list(now)),
	}
}

type summaryView struct {
	Service       string    `json:"service"`
	InstanceID    string    `json:"instance_id"`
	Address       string    `json:"address"`
	Status        string    `json:"status"`
	Transport     string    `json:"transport"`
	Codec         string    `json:"codec"`
	Registry      string    `json:"registry"`
	Started       time.Time `json:"started"`
	UptimeSeconds float64   `json:"uptime_s"`
	Now           time.Time `json:"now"`
	Calls         int64     `json:"calls"`
	Errors        int64     `json:"errors"`
	QPS           float64   `json:"qps"`
	InFlight      int64     `json:"in_flight"`
	Connections   int       `json:"connections"`
	GoVersion     string    `json:"go_version"`
	Goroutines    int       `json:"goroutines"`
}

func (cn *console) summary(now time.Time) summaryView {
	s := cn.s
	st := s.probeStatus()
	inst := s.Instance()
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	v := summaryView{
		Service: s.cfg.Service, InstanceID: inst.ID, Address: inst.Address, Status: string(st),
		Transport: s.cfg.Transport.Name, Codec: s.codec.Name(), Registry: s.cfg.Registry.Name,
		Started: cn.started, UptimeSeconds: now.Sub(cn.started).Seconds(), Now: now,
		InFlight: s.inflight.Load(), Connections: open,
		GoVersion: runtime.Version(), Goroutines: runtime.NumGoroutine(),
	}
	for _, m := range cn.methods(now) {
		v.Calls += m.Calls
		v.Errors += m.Errors
		v.QPS += m.QPS
	}
	return v
}

// pluginView is one built plugin. Options are its effective options:
// the engine keeps only the built value, not the struct its factory
// decoded, so the console decodes the config's options over the
// factory's defaults again, as the factory did.
type pluginView struct {
	Kind    string          `json:"kind"`
	Name    string          `json:"name"`
	Doc     string          `json:"doc,omitempty"`
	Options json.RawMessage `json:"options"`
	// Configured is the options the config sets, the rest being defaults.
	Configured []string `json:"configured"`
	Error      string   `json:"error,omitempty"`
	// Reports and Routes say whether the plugin reports state and serves
	// admin pages.
	Reports bool     `json:"reports_state"`
	Routes  []string `json:"routes,omitempty"`
}

func (cn *console) effectivePlugins() []pluginView {
	infos := pluginInfos()
	var out []pluginView
	for _, b := range cn.s.plugins.list() {
		opts := b.options
		in, ok := infos[b.Kind][b.Name]
		if !ok {
			infos = pluginInfos()
			in = infos[b.Kind][b.Name]
		}
		// The options are decoded into in.Defaults: another entry of this
		// plugin (two token buckets, say) must start from fresh defaults,
		// not from this one's options.
		delete(infos[b.Kind], b.Name)
		v := pluginView{Kind: string(b.Kind), Name: b.Name, Doc: in.Doc, Configured: slices.Sorted(maps.Keys(opts)), Options: json.RawMessage("null")}
		if v.Configured == nil {
			v.Configured = []string{}
		}
		if _, ok := b.Plugin.(kernel.StateReporter); ok {
			v.Reports = true
		}
		if ah, ok := b.Plugin.(kernel.AdminHandler); ok {
			for _, r := range ah.AdminRoutes() {
				v.Routes = append(v.Routes, r.Pattern)
			}
		}
		if in.Defaults != nil {
			if err := kernel.DecodeOptions(opts, in.Defaults); err != nil {
				v.Error = err.Error()
			} else {
				hideSecrets(reflect.ValueOf(in.Defaults))
				if data, err := json.Marshal(in.Defaults); err != nil {
					v.Error = err.Error()
				} else {
					v.Options = data
				}
			}
		}
		out = append(out, v)
	}
	return out
}

// pluginInfos is every registered plugin by kind and name, each with
// defaults of its own.
func pluginInfos() map[kernel.Kind]map[string]kernel.PluginInfo {
	infos := map[kernel.Kind]map[string]kernel.PluginInfo{}
	for _, in := range kernel.Plugins() {
		if infos[in.Kind] == nil {
			infos[in.Kind] = map[string]kernel.PluginInfo{}
		}
		infos[in.Kind][in.Name] = in
	}
	return infos
}

// hiddenSecret stands, in the plugins view, for the value of an option
// tagged secret:"true" that is set.
const hiddenSecret = "(hidden)"

// hideSecrets replaces in the options struct v the values of the fields
// tagged secret:"true" (tokens, keys, passwords) that are set, so that
// the console shows that they are set, never what they are: the admin
// address is often reachable by more than who may call the service. It
// looks into nested structs (a tls block) too, and into the elements of
// lists and maps (rules, peers) that hold structs.
func hideSecrets(v reflect.Value) {
	detach(v)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			hideSecrets(v.Elem())
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			hideSecrets(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			// A map's values cannot be set in place: each is copied, its
			// secrets hidden, and put back.
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			hideSecrets(e)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		if !v.CanSet() {
			return
		}
		t := v.Type()
		for i := range t.NumField() {
			sf, fv := t.Field(i), v.Field(i)
			if !sf.IsExported() || sf.Tag.Get("json") == "-" {
				continue // not shown
			}
			if sf.Tag.Get("secret") == "true" {
				hideValue(fv)
			} else {
				hideSecrets(fv)
			}
		}
	}
}

// detach gives settable v a shallow copy of the slice, map or struct it
// points into before hiding changes it: decoded options may share these
// with a plugin's defaults (a package-level list, a pointer to a shared
// block), which hiding in place would rewrite for every later plugin.
func detach(v reflect.Value) {
	if !v.CanSet() || v.IsZero() {
		return
	}
	switch v.Kind() {
	case reflect.Slice:
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(c, v)
		v.Set(c)
	case reflect.Map:
		c := reflect.MakeMapWithSize(v.Type(), v.Len())
		for it := v.MapRange(); it.Next(); {
			c.SetMapIndex(it.Key(), it.Value())
		}
		v.Set(c)
	case reflect.Pointer:
		c := reflect.New(v.Type().Elem())
		c.Elem().Set(v.Elem())
		v.Set(c)
	}
}

// hideValue hides a secret option's value: each string in it (a list's,
// or a map's values, its keys being ids) becomes hiddenSecret; anything
// else that is set becomes its zero value.
func hideValue(v reflect.Value) {
	detach(v)
	switch v.Kind() {
	case reflect.String:
		if v.Len() > 0 {
			v.SetString(hiddenSecret)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			hideValue(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			hideValue(e)
			v.SetMapIndex(k, e)
		}
	case reflect.Pointer:
		if !v.IsNil() {
			hideValue(v.Elem())
		}
	default:
		if !v.IsZero() {
			v.SetZero()
		}
	}
}

type connView struct {
	Peer       string    `json:"peer"`
	Since      time.Time `json:"since"`
	AgeSeconds float64   `json:"age_s"`
	InFlight   int       `json:"in_flight"`
}

func (cn *console) connections(now time.Time) []connView {
	s := cn.s
	s.mu.Lock()
	out := make([]connView, 0, len(s.conns))
	conns := make([]*serverConn, 0, len(s.conns))
	for sc, since := range s.conns {
		conns = append(conns, sc)
		out = append(out, connView{Peer: sc.conn.RemoteAddr(), Since: since, AgeSeconds: now.Sub(since).Seconds()})
	}
	s.mu.Unlock()
	// Each connection's own lock, one at a time, outside the server's.
	for i, sc := range conns {
		sc.mu.Lock()
		out[i].InFlight = len(sc.calls)
		sc.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b connView) int { return a.Since.Compare(b.Since) })
	return out
}

// stateView is one state reporter's readings.
type stateView struct {
	Kind     string        `json:"kind"`
	Name     string        `json:"name"`
	Readings []readingView `json:"readings"`
	// Error says why the readings are missing: the report panicked.
	Error string `json:"error,omitempty"`
}

type readingView struct {
	Name   string            `json:"name"`
	Help   string            `json:"help"`
	Kind   string            `json:"kind"`
	Labels map[string]string `json:"labels"`
	Value  readingValue      `json:"value"`
}

// readingValue is a reading's value in JSON: a number, or, for NaN and
// the infinities, which JSON has no number for (encoding/json refuses
// them, failing the whole document), the string Prometheus' HTTP API
// writes: "NaN", "+Inf", "-Inf".
type readingValue float64

func (v readingValue) MarshalJSON() ([]byte, error) {
	f := float64(v)
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(f)
}

func (cn *console) state() []stateView {
	var out []stateView
	read := func(kind kernel.Kind, name string, r kernel.StateReporter) {
		v := stateView{Kind: string(kind), Name: name, Readings: []readingView{}}
		// A report that panics loses its own readings, not every view:
		// /status.json is one document.
		defer func() {
			if p := recover(); p != nil {
				v.Readings, v.Error = []readingView{}, fmt.Sprintf("ReportState panicked: %v", p)
				out = append(out, v)
			}
		}()
		r.ReportState(func(rd kernel.Reading) {
			kind := "gauge"
			if rd.Kind == kernel.Counter {
				kind = "counter"
			}
			labels := make(map[string]string, len(rd.Labels))
			for _, l := range rd.Labels {
				labels[l.Name] = l.Value
			}
			v.Readings = append(v.Readings, readingView{rd.Name, rd.Help, kind, labels, readingValue(rd.Value)})
		})
		out = append(out, v)
	}
	read(kernel.KindEngine, "kernrpc", serverState{cn.s})
	for _, b := range cn.s.plugins.list() {
		if r, ok := b.Plugin.(kernel.StateReporter); ok {
			read(b.Kind, b.Name, r)
		}
	}
	return out
}

// instancesView is the registry's answer for this server's service.
type instancesView struct {
	Service  string         `json:"service"`
	Registry string         `json:"registry"`
	Self     string         `json:"self"` // this server's instance id
	Resolved time.Time      `json:"resolved"`
	CacheFor float64        `json:"cached_for_s"`
	Error    string         `json:"error,omitempty"`
	List     []instanceView `json:"instances"`
}

type instanceView struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Metadata map[string]string `json:"metadata"`
	InFlight int64             `json:"load_in_flight"`
	QPS      float64           `json:"load_qps"`
	Updated  *time.Time        `json:"load_updated,omitempty"`
}

func (cn *console) instances(ctx context.Context) instancesView {
	cn.instMu.Lock()
	defer cn.instMu.Unlock()
	if !cn.instAt.IsZero() && time.Since(cn.instAt) < instancesCacheFor {
		return cn.inst
	}
	s := cn.s
	page := ctx
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	v := instancesView{Service: s.cfg.Service, Registry: s.cfg.Registry.Name, Self: s.Instance().ID,
		CacheFor: instancesCacheFor.Seconds(), List: []instanceView{}}
	list, err := s.registry.Resolve(ctx, s.cfg.Service)
	v.Resolved = time.Now()
	if err != nil {
		v.Error = err.Error()
		if page.Err() != nil {
			// The page's request went away: do not keep that as the
			// answer. A registry that did not answer within
			// resolveTimeout is kept, as any error is, so that page loads
			// do not queue up behind one Resolve after another.
			return v
		}
	}
	for _, in := range list {
		iv := instanceView{ID: in.ID, Address: in.Address, Metadata: in.Metadata, InFlight: in.Load.InFlight, QPS: in.Load.QPS}
		if !in.Load.Updated.IsZero() {
			t := in.Load.Updated
			iv.Updated = &t
		}
		if iv.Metadata == nil {
			iv.Metadata = map[string]string{}
		}
		v.List = append(v.List, iv)
	}
	slices.SortFunc(v.List, func(a, b instanceView) int { return strings.Compare(a.ID, b.ID) })
	cn.inst, cn.instAt = v, v.Resolved
	return v
}

type slowView struct {
	At         time.Time `json:"at"`
	Method     string    `json:"method"`
	DurationMs float64   `json:"duration_ms"`
	Code       string    `json:"code"`
	Peer       string    `json:"peer"`
	TraceID    string    `json:"trace_id"`
}

func slowViews(calls []slowCall) []slowView {
	out := make([]slowView, len(calls))
	for i, c := range calls {
		out[i] = slowView{c.At, c.Method, millis(c.Duration), c.Code.String(), c.Peer, c.TraceID}
	}
	return out
}

func (cn *console) servePage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, consolePage)
}
