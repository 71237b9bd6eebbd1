// Package prometheus is a filter that measures every call in Prometheus
// metrics, on the client and the server side, and serves them on /metrics:
// calls by service, method and code, a latency histogram, calls in flight,
// request and response bytes, the state the other plugins and the engine
// report (breakers, token buckets, overload, connections, instances), and
// the Go runtime's and the process's own metrics. docs/observability.md
// lists every metric with its labels.
//
// Config name: "prometheus". It is its own Go module (it brings in
// github.com/prometheus/client_golang), so a program imports it itself:
//
//	import _ "github.com/kernrpc/kernrpc/plugins/filter/prometheus"
//
// Options, with defaults:
//
//	filters:
//	  - name: prometheus          # side: both (the default) measures both ends
//	    options:
//	      address: ""             # serve /metrics on this address too, e.g. 127.0.0.1:9464; empty: no listener of its own
//	      registry: own           # own: a registry of this filter's own; default: client_golang's process-wide one
//	      buckets: [50µs, 100µs, 250µs, 500µs, 1ms, 2.5ms, 5ms, 10ms, 25ms, 50ms, 100ms, 250ms, 500ms, 1s, 2.5s, 5s, 10s]
//	      native_histograms: false # also keep native (sparse) histograms, scraped over the protobuf format
//	      go_metrics: true        # the Go runtime's metrics (go_*)
//	      process_metrics: true   # the process's metrics (process_*: CPU, memory, descriptors)
//	      max_methods: 1000       # distinct methods measured per side (and as many streaming ones); calls of others count as method "_other"
//
// # Where /metrics is served
//
// A server started with server.admin_address mounts this filter's
// AdminRoutes there ("GET /metrics"), beside its other admin pages: that
// is the usual way. The address option is for a process without one (a
// pure client): the filter then listens itself, until it is closed.
//
// # One registry per filter, or the process's
//
// The engine builds a filter for each Server and each Client, so with
// registry: own a process that both serves and calls has one registry per
// Server and per Client, and the server's /metrics shows only its own
// side. That is the default because it is exact and isolated: two servers
// in one process (or one test binary) never mix their counts. With
// registry: default every such filter adds to client_golang's
// prometheus.DefaultRegisterer (the first one built registers the metric
// families, later ones reuse them, keeping the first one's buckets and
// max_methods), and
// /metrics serves prometheus.DefaultGatherer: one page per process with
// both sides and whatever else the program registered there. Configure
// address on one filter only then (for instance on a side: client entry):
// two filters cannot listen on one address.
//
// # The plugins' state
//
// The filter is a kernel.PluginsObserver: the engine gives it every
// plugin its Server or Client built, and at each scrape it reads those
// that are kernel.StateReporters (the breaker's states, the token
// bucket's tokens, the overload limit; the engine's own connections and
// instances) and serves each reading as kernrpc_<reading name>, a gauge or
// a counter (state.go). A plugin's readings get a side label, the side of
// the Server or Client that built it; the engine's name their side
// already. Series reported alike by two plugins (two Clients of one
// service with registry: default, two filters of one kind in a config)
// are added up, never collected twice; a reading that cannot be exposed
// is left out and logged once, and a reporter that panics loses its
// readings for that scrape, counted in kernrpc_state_report_panics_total.
// docs/observability.md lists every family.
//
// # What is counted
//
// Invoke counts and times every call it sees. On the server the filter
// is also a kernel.CallObserver: the server calls CallEnded once the
// answer of a call of a served method is written, with its size and
// code, and kernrpc_server_calls_total counts every call there, by the
// code it was answered with (Internal for a handler's answer that failed
// to encode, ResourceExhausted with no response bytes for one the
// transport refused for its size, Unknown for an error that claims OK).
// The calls answered before Invoke (refused by a
// kernel.Admitter such as auth, token-bucket or overload, or whose
// request did not decode) are counted in the request bytes there too,
// but not timed: the histogram counts the calls that went through Invoke
// only. In the client's call stage (the default) the filter counts
// calls, and kernrpc_client_attempts_total the attempts they took;
// configured with stage: attempt it counts attempts instead.
//
// # Streams
//
// The filter is a kernel.StreamFilter, with the same options: a streaming
// call is counted when it opens (kernrpc_<side>_streams_started_total)
// and, by its code, when it ends (kernrpc_<side>_streams_ended_total: on
// the server when the handler returns, on the client when the caller has
// read the end or closed the stream), kernrpc_<side>_streams_in_flight is
// the difference, and every message that passes is counted as it passes,
// each way (kernrpc_<side>_stream_messages_sent_total and _received_total,
// SendMsg or RecvMsg returning nil). Streams are neither timed nor sized:
// a stream lives as long as its application keeps it, and its messages
// are not yet encoded where the filter sees them. A streaming method's
// series appear with its first stream; max_methods bounds streaming
// methods apart from the others. A stream costs one allocation (the
// wrapper) and a message an uncontended atomic add, on a shard the stream
// picked when it opened (BenchmarkStream).
//
// # What one call costs
//
// The labels of a method are resolved the first time it is called, on each
// side, and kept in a copy-on-write map read without a lock. Its figures
// are integer counters (calls by code, bytes, attempts, a count per
// latency bucket, the durations' sum in ns) in a few shards of their own
// cache lines, one picked at random per call, so that calls of one method
// on several cores seldom write the same line; a scrape adds the shards
// up into const metrics (collect.go). A call costs two clock reads and a
// few uncontended atomic adds, with no allocation (BenchmarkInvoke). With
// native_histograms the duration also goes to client_golang's own
// histogram, which keeps the sparse buckets (a const native histogram
// would need them kept by hand), at the cost of its shared atomics.
package prometheus

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "prometheus"

// Registry option values.
const (
	RegistryOwn     = "own"
	RegistryDefault = "default"
)

// Options configure the filter.
type Options struct {
	// Address, when set, is where the filter serves /metrics itself.
	Address string `json:"address"`
	// Registry is "own" (a registry of this filter's own) or "default"
	// (client_golang's prometheus.DefaultRegisterer and DefaultGatherer).
	Registry string `json:"registry"`
	// Buckets are the upper bounds of the latency histograms' buckets, in
	// increasing order.
	Buckets []kernel.Duration `json:"buckets"`
	// NativeHistograms adds native histograms beside the classic buckets.
	NativeHistograms bool `json:"native_histograms"`
	// GoMetrics registers the Go runtime collector.
	GoMetrics bool `json:"go_metrics"`
	// ProcessMetrics registers the process collector.
	ProcessMetrics bool `json:"process_metrics"`
	// MaxMethods bounds the distinct methods measured on each side, so that
	// callers naming arbitrary methods cannot grow the series without end.
	MaxMethods int `json:"max_methods"`
}

// DefaultBuckets are the latency buckets by default: 50µs to 10s, about
// three per decade, so that histogram_quantile is close from a loopback
// call to a slow backend.
func DefaultBuckets() []kernel.Duration {
	var b []kernel.Duration
	for _, d := range []time.Duration{
		50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
		time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
		25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
		500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	} {
		b = append(b, kernel.Duration(d))
	}
	return b
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{
		Registry:       RegistryOwn,
		Buckets:        DefaultBuckets(),
		GoMetrics:      true,
		ProcessMetrics: true,
		MaxMethods:     1000,
	}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "Prometheus metrics of every call (count, latency, in flight, bytes), served on /metrics", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// Filter is the prometheus filter.
type Filter struct {
	reg      prom.Registerer
	gather   prom.Gatherer
	handler  http.Handler
	calls    *callCollector // the call families, shared by the filters of a registry
	listener *listener
	closed   sync.Once
	epoch    time.Time // calls are timed as time.Since(epoch), a monotonic reading

	state       *stateSet // the plugins' readings, shared by the filters of one registry
	stateClosed bool      // Close ran: ObservePlugins adds nothing; under state.mu
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.StagedFilter = (*Filter)(nil)
	_ kernel.AdminHandler = (*Filter)(nil)
	_ kernel.CallObserver = (*Filter)(nil)
)

// New builds the filter from decoded options and, with address set,
// starts its listener.
func New(o *Options) (kernel.Filter, error) {
	buckets, err := bucketBounds(o.Buckets)
	if err != nil {
		return nil, fmt.Errorf("option \"buckets\": %w", err)
	}
	if o.MaxMethods < 1 {
		return nil, fmt.Errorf("option \"max_methods\": must be at least 1, got %d", o.MaxMethods)
	}
	f := &Filter{epoch: time.Now()}
	switch o.Registry {
	case RegistryOwn:
		r := prom.NewRegistry()
		f.reg, f.gather = r, r
	case RegistryDefault:
		f.reg, f.gather = prom.DefaultRegisterer, prom.DefaultGatherer
	default:
		return nil, fmt.Errorf("option \"registry\": is %q; want %q or %q", o.Registry, RegistryOwn, RegistryDefault)
	}
	if f.calls, err = registerCalls(f.reg, buckets, o.NativeHistograms, o.MaxMethods); err != nil {
		return nil, err
	}
	if err := f.registerRuntime(o); err != nil {
		return nil, err
	}
	if f.state, err = registerState(f.reg); err != nil {
		return nil, err
	}
	f.handler = promhttp.InstrumentMetricHandler(f.reg, promhttp.HandlerFor(f.gather, promhttp.HandlerOpts{
		Registry:          f.reg, // counts its own errors in promhttp_metric_handler_errors_total
		EnableOpenMetrics: true,
	}))
	if o.Address != "" {
		if f.listener, err = listen(o.Address, f.handler); err != nil {
			return nil, fmt.Errorf("option \"address\": %w", err)
		}
	}
	return f, nil
}

// bucketBounds checks the buckets option and converts it to seconds.
func bucketBounds(in []kernel.Duration) ([]float64, error) {
	if len(in) == 0 {
		return nil, errors.New("must list at least one bucket bound")
	}
	out := make([]float64, len(in))
	for i, d := range in {
		if d <= 0 {
			return nil, fmt.Errorf("bound %s must be positive", d)
		}
		if i > 0 && d <= in[i-1] {
			return nil, fmt.Errorf("bounds must increase, but %s follows %s", d, in[i-1])
		}
		out[i] = d.D().Seconds()
	}
	return out, nil
}

// registerRuntime registers the Go and process collectors the options ask
// for. In the default registry they may be there already (client_golang
// registers both itself): that is no error.
func (f *Filter) registerRuntime(o *Options) error {
	var cs []prom.Collector
	if o.GoMetrics {
		cs = append(cs, collectors.NewGoCollector())
	}
	if o.ProcessMetrics {
		cs = append(cs, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	for _, c := range cs {
		if err := f.reg.Register(c); err != nil && !errors.As(err, &prom.AlreadyRegisteredError{}) {
			return fmt.Errorf("registering the runtime collectors: %w", err)
		}
	}
	return nil
}

// Stage puts the filter in the client's call stage unless a config says
// otherwise: it measures calls as the caller sees them, retries included.
func (f *Filter) Stage() kernel.Stage { return kernel.CallStage }

// AdminRoutes offers /metrics to the server's admin address.
func (f *Filter) AdminRoutes() []kernel.AdminRoute {
	return []kernel.AdminRoute{{
		Pattern: "GET /metrics",
		Handler: f.handler,
		Doc:     "Prometheus metrics: calls, latency, in flight, bytes; the plugins' and the engine's state; Go runtime and process",
	}}
}

// Handler serves the filter's metrics in the Prometheus exposition
// formats, as /metrics does.
func (f *Filter) Handler() http.Handler { return f.handler }

// Registerer is where the filter's metrics are registered: a program may
// add its own there, to have them on the same page.
func (f *Filter) Registerer() prom.Registerer { return f.reg }

// Gatherer is what /metrics serves.
func (f *Filter) Gatherer() prom.Gatherer { return f.gather }

// Addr is the address the filter's own listener is bound to (the address
// option resolved, e.g. with port 0), or "" without one.
func (f *Filter) Addr() string {
	if f.listener == nil {
		return ""
	}
	return f.listener.addr
}

// Close stops the filter's own listener, if it has one, waiting for its
// goroutine, and stops reading the state of the plugins it observed
// (their Server or Client is closing). The call metrics stay registered:
// a counter must not reset while the process lives. It is idempotent.
func (f *Filter) Close() error {
	var err error
	f.closed.Do(func() {
		f.state.forget(f)
		if f.listener != nil {
			err = f.listener.close()
		}
	})
	return err
}

// listener serves /metrics on the address option.
type listener struct {
	srv    *http.Server
	addr   string
	served chan struct{}
}

func listen(addr string, h http.Handler) (*listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	l := &listener{
		srv:    &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		addr:   ln.Addr().String(),
		served: make(chan struct{}),
	}
	go func() {
		defer close(l.served)
		_ = l.srv.Serve(ln) // returns ErrServerClosed once close runs
	}()
	return l, nil
}

// close stops accepting, ends the scrapes in progress and waits for the
// serving goroutine.
func (l *listener) close() error {
	err := l.srv.Close()
	<-l.served
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
