package kernel

// Reading is one figure a plugin reports of its own state: a breaker's
// state for one method and host, a token bucket's level, the limit an
// overload filter has learnt. Exporters turn readings into metrics; the
// status console shows them.
type Reading struct {
	// Name is in the shape of a Prometheus metric name without a prefix
	// ("breaker_state", "token_bucket_rejected_total"), with base units in
	// it and _total for counters; exporters add their own prefix.
	Name string
	// Help says what the figure means, in one sentence.
	Help string
	Kind ReadingKind
	// Labels tell the series of one Name apart; every reading of a Name
	// has the same label names, in the same order.
	Labels []Label
	Value  float64
}

// Label is one label of a Reading.
type Label struct{ Name, Value string }

// ReadingKind says how a Reading's value behaves.
type ReadingKind uint8

const (
	// Gauge goes up and down: a level, a state, a count of things now.
	Gauge ReadingKind = iota
	// Counter only goes up, from the plugin's start.
	Counter
)

// StateReporter is an optional interface for a plugin of any kind: it
// reports figures of its own state when asked (a scrape, the console),
// so that nothing is added to a call. ReportState calls emit once per
// series; it may be called from any goroutine, concurrently with calls.
type StateReporter interface {
	ReportState(emit func(Reading))
}

// PluginRef names one plugin a Server or Client built.
type PluginRef struct {
	Kind Kind
	Name string
	// Side is the side of the Server (ServerSide) or Client (ClientSide)
	// that built the plugin.
	Side   Side
	Plugin any
}

// PluginsObserver is an optional interface for a plugin that reads the
// others' state (a metrics exporter, a console): once every plugin of its
// Server or Client is built, and before the first call, it is given them
// all, itself included, and the engine's own StateReporter (connections,
// instances seen) under Kind "engine".
type PluginsObserver interface {
	ObservePlugins(plugins []PluginRef)
}

// KindEngine is the Kind under which the engine's own StateReporter is
// passed to a PluginsObserver.
const KindEngine Kind = "engine"
