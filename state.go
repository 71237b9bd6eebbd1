package kernrpc

import (
	"github.com/kernrpc/kernrpc/kernel"
)

// observePlugins gives every built plugin that reads the others' state
// (kernel.PluginsObserver) the whole list, with the engine's own reporter.
func (p *plugins) observePlugins(side kernel.Side, engine kernel.StateReporter) {
	refs := make([]kernel.PluginRef, 0, len(p.built)+1)
	for _, b := range p.built {
		refs = append(refs, kernel.PluginRef{Kind: b.Kind, Name: b.Name, Side: side, Plugin: b.Plugin})
	}
	refs = append(refs, kernel.PluginRef{Kind: kernel.KindEngine, Name: "kernrpc", Side: side, Plugin: engine})
	for _, b := range p.built {
		if o, ok := b.Plugin.(kernel.PluginsObserver); ok {
			o.ObservePlugins(refs)
		}
	}
}

// serverState is the server's own figures, read when a plugin asks.
type serverState struct{ s *Server }

var _ kernel.StateReporter = serverState{}

func (st serverState) ReportState(emit func(kernel.Reading)) {
	s := st.s
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	transport := []kernel.Label{{Name: "transport", Value: s.cfg.Transport.Name}}
	emit(kernel.Reading{Name: "server_connections_open", Help: "Connections the server holds now.",
		Kind: kernel.Gauge, Labels: transport, Value: float64(open)})
	emit(kernel.Reading{Name: "server_connections_refused_total", Help: "Connections closed on accept because the server held server.max_connections.",
		Kind: kernel.Counter, Labels: transport, Value: float64(s.refusedConns.Load())})
	emit(kernel.Reading{Name: "server_connections_accepted_total", Help: "Connections the server accepted and held, since it started.",
		Kind: kernel.Counter, Labels: transport, Value: float64(s.acceptedConns.Load())})
	emit(kernel.Reading{Name: "server_streams_open", Help: "Streams whose handler runs now.",
		Kind: kernel.Gauge, Labels: transport, Value: float64(s.streamsOpen.Load())})
	emit(kernel.Reading{Name: "server_streams_total", Help: "Streams the server opened (started a handler for), since it started.",
		Kind: kernel.Counter, Labels: transport, Value: float64(s.streamsTotal.Load())})
	serving := 0.0
	if s.probeStatus() == HealthServing {
		serving = 1
	}
	emit(kernel.Reading{Name: "server_serving", Help: "1 while the server's health, and its service's, is SERVING, else 0.",
		Kind: kernel.Gauge, Labels: []kernel.Label{{Name: "service", Value: s.cfg.Service}}, Value: serving})
	emit(kernel.Reading{Name: "server_gc_headroom_bytes", Help: "Heap the process keeps in reserve (gc_headroom) while this server holds it, since it read a large message; else 0.",
		Kind: kernel.Gauge, Labels: []kernel.Label{{Name: "service", Value: s.cfg.Service}}, Value: float64(s.headroom.bytes())})
}

// clientState is the client's own figures.
type clientState struct{ c *Client }

var _ kernel.StateReporter = clientState{}

func (st clientState) ReportState(emit func(kernel.Reading)) {
	c := st.c
	open, spare := 0, 0
	count := func(p *connPool) {
		n, s := p.open()
		open, spare = open+n, spare+s
	}
	// The pools of instances that left the registry hold connections too
	// while calls or streams run on them. Both sets are read under the
	// lock a report moves a pool from one to the other under: a pool read
	// in each would be counted twice.
	c.poolsMu.Lock()
	for _, p := range *c.pools.Load() {
		count(p)
	}
	for p := range c.retired {
		count(p)
	}
	c.poolsMu.Unlock()
	labels := []kernel.Label{{Name: "service", Value: c.service}, {Name: "transport", Value: c.cfg.Transport.Name}}
	emit(kernel.Reading{Name: "client_connections_open", Help: "Connections the client holds now, to all instances of the service.",
		Kind: kernel.Gauge, Labels: labels, Value: float64(open)})
	emit(kernel.Reading{Name: "client_connections_spare", Help: "Of the connections open, those dialled only to spread large calls (client.max_pool_size).",
		Kind: kernel.Gauge, Labels: labels, Value: float64(spare)})
	emit(kernel.Reading{Name: "client_streams_open", Help: "Streams open now on the client's connections to the service.",
		Kind: kernel.Gauge, Labels: labels, Value: float64(c.streamsOpen.Load())})
	emit(kernel.Reading{Name: "client_instances", Help: "Instances of the service the registry reported last.",
		Kind: kernel.Gauge, Labels: []kernel.Label{{Name: "service", Value: c.service}, {Name: "registry", Value: c.cfg.Registry.Name}},
		Value: float64(c.instances.Load())})
	emit(kernel.Reading{Name: "client_registry_updates_total", Help: "Reports of the service's instances the client took from the registry: the first set, then one a change.",
		Kind: kernel.Counter, Labels: []kernel.Label{{Name: "service", Value: c.service}, {Name: "registry", Value: c.cfg.Registry.Name}},
		Value: float64(c.registryUpdates.Load())})
	emit(kernel.Reading{Name: "client_gc_headroom_bytes", Help: "Heap the process keeps in reserve (gc_headroom) while this client holds it, since it read a large message; else 0.",
		Kind: kernel.Gauge, Labels: []kernel.Label{{Name: "service", Value: c.service}}, Value: float64(c.headroom.bytes())})
}
