package kernrpc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/kernrpc/kernrpc/kernel"
)

// plugins is what a config composes for one side: the server and the
// client build it the same way and close it the same way.
type plugins struct {
	transport kernel.Transport
	codec     kernel.Codec
	registry  kernel.Registry
	balancer  kernel.Balancer // client side only
	// The client's filters by stage; a server's are all in callFilters.
	callFilters    []configuredFilter
	attemptFilters []configuredFilter
	built          []BuiltPlugin // everything built, closed in order by close
}

// BuiltPlugin is one plugin a Server or Client built from its config.
type BuiltPlugin struct {
	Kind kernel.Kind
	Name string
	// Plugin is the value the plugin's factory returned.
	Plugin any

	options map[string]any // from its config entry
}

// FindPlugin returns the first plugin named name in built (from
// Server.Plugins or Client.Plugins) that is a T: a test reads a counting
// filter's count this way, without a package variable.
func FindPlugin[T any](built []BuiltPlugin, name string) (T, bool) {
	for _, b := range built {
		if t, ok := b.Plugin.(T); ok && b.Name == name {
			return t, true
		}
	}
	var zero T
	return zero, false
}

func (p *plugins) add(kind kernel.Kind, name string, v any, options map[string]any) {
	p.built = append(p.built, BuiltPlugin{Kind: kind, Name: name, Plugin: v, options: options})
}

func (p *plugins) list() []BuiltPlugin { return append([]BuiltPlugin(nil), p.built...) }

// buildPlugins builds every plugin cfg names for side and decodes the
// options of those only the other side uses, so that a bad config reports
// every bad plugin at once (joined, in config order) while each options
// block is decoded once: a short-lived client pays for its config once.
// On error it closes what it had built and returns nil.
func buildPlugins(cfg *Config, side kernel.Side) (*plugins, error) {
	p := &plugins{}
	var errs []error
	keep := func(kind kernel.Kind, name string, v any, options map[string]any, err error) bool {
		if err != nil {
			errs = append(errs, err)
			return false
		}
		p.add(kind, name, v, options)
		return true
	}
	var err error
	p.transport, err = kernel.NewTransport(cfg.Transport.Name, cfg.Transport.Options, cfg.Source)
	keep(kernel.KindTransport, cfg.Transport.Name, p.transport, cfg.Transport.Options, err)
	p.codec, err = kernel.NewCodec(cfg.Codec.Name, cfg.Codec.Options, cfg.Source)
	keep(kernel.KindCodec, cfg.Codec.Name, p.codec, cfg.Codec.Options, err)
	p.registry, err = kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, cfg.Source)
	keep(kernel.KindRegistry, cfg.Registry.Name, p.registry, cfg.Registry.Options, err)
	if side == kernel.ClientSide {
		p.balancer, err = kernel.NewBalancer(cfg.Balancer.Name, cfg.Balancer.Options, cfg.Source)
		keep(kernel.KindBalancer, cfg.Balancer.Name, p.balancer, cfg.Balancer.Options, err)
	} else if err := kernel.CheckOptions(kernel.KindBalancer, cfg.Balancer.Name, cfg.Balancer.Options, cfg.Source); err != nil {
		errs = append(errs, err)
	}
	for i, fc := range cfg.Filters {
		if fc.Side != "" && fc.Side != "both" && fc.Side != side.String() {
			if err := kernel.CheckOptions(kernel.KindFilter, fc.Name, fc.Options, cfg.Source); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		f, err := kernel.NewFilter(fc.Name, fc.Options, cfg.Source)
		if err == nil {
			if only, other := otherSide(f, side); other {
				switch {
				case only != kernel.ClientSide && only != kernel.ServerSide:
					errs = append(errs, cfg.errorf(fmt.Sprintf("filters[%d]", i),
						"(%s) declares side %s, which is neither client nor server", fc.Name, only))
				case fc.Side == side.String():
					errs = append(errs, cfg.errorf(fmt.Sprintf("filters[%d].side", i),
						"is %s, but filter %q works on the %s side only; set side: %s, or leave side out", fc.Side, fc.Name, only, only))
				}
				closeFilter(f)
				continue
			}
		}
		if !keep(kernel.KindFilter, fc.Name, f, fc.Options, err) {
			continue
		}
		// The filter's own copy of its methods: a client builds its chain
		// for a method on that method's first call, long after the
		// program may have changed cfg for another client.
		cf := configuredFilter{filter: f, name: fc.Name, methods: slices.Clone(fc.Methods)}
		if side == kernel.ServerSide {
			p.callFilters = append(p.callFilters, cf)
			continue
		}
		stage, err := filterStage(fc, f)
		if err != nil {
			errs = append(errs, cfg.errorf(fmt.Sprintf("filters[%d].stage", i), "%v", err))
			continue
		}
		if stage == kernel.AttemptStage {
			p.attemptFilters = append(p.attemptFilters, cf)
		} else {
			p.callFilters = append(p.callFilters, cf)
		}
	}
	if len(errs) > 0 {
		p.close(slog.Default)
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// otherSide reports whether f declares (kernel.SidedFilter) that it works
// on one side only, and that side, only, is not side.
func otherSide(f kernel.Filter, side kernel.Side) (only kernel.Side, other bool) {
	sf, ok := f.(kernel.SidedFilter)
	if !ok {
		return 0, false
	}
	only = sf.Side()
	return only, only != side
}

// closeFilter closes a filter built only to learn it belongs elsewhere.
func closeFilter(f kernel.Filter) {
	if c, ok := f.(io.Closer); ok {
		_ = c.Close()
	}
}

// filterStage is the stage the config names, else the one the filter
// declares, else the call stage.
func filterStage(fc FilterConfig, f kernel.Filter) (kernel.Stage, error) {
	switch fc.Stage {
	case "call":
		return kernel.CallStage, nil
	case "attempt":
		return kernel.AttemptStage, nil
	case "":
	default:
		return 0, fmt.Errorf("is %q; want call or attempt", fc.Stage)
	}
	if sf, ok := f.(kernel.StagedFilter); ok {
		if st := sf.Stage(); st == kernel.CallStage || st == kernel.AttemptStage {
			return st, nil
		}
		return 0, fmt.Errorf("filter %q declares stage %d, which is neither call nor attempt", fc.Name, sf.Stage())
	}
	return kernel.CallStage, nil
}

// close closes every plugin that implements io.Closer.
func (p *plugins) close(log func() *slog.Logger) {
	for _, b := range p.built {
		if c, ok := b.Plugin.(io.Closer); ok {
			if err := c.Close(); err != nil {
				log().Warn("closing plugin", "kind", b.Kind, "plugin", b.Name, "err", err)
			}
		}
	}
}
