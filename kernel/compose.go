package kernel

import (
	"fmt"
	"io"
	"log/slog"
)

// plugins is what a config composes for one side: the server and the
// client build it the same way and close it the same way.
type plugins struct {
	transport Transport
	codec     Codec
	registry  Registry
	balancer  Balancer // client side only
	filters   []configuredFilter
	built     []any // everything built, closed in order by close
}

// buildPlugins builds every plugin cfg names for side. On error it closes
// what it had built and returns nil.
func buildPlugins(cfg *Config, side Side) (p *plugins, err error) {
	p = &plugins{}
	defer func() {
		if err != nil {
			p.close(slog.Default())
			p = nil
		}
	}()
	if p.transport, err = NewTransport(cfg.Transport.Name, cfg.Transport.Options, cfg.Source); err != nil {
		return p, err
	}
	p.built = append(p.built, p.transport)
	if p.codec, err = NewCodec(cfg.Codec.Name, cfg.Codec.Options, cfg.Source); err != nil {
		return p, err
	}
	p.built = append(p.built, p.codec)
	if p.registry, err = NewRegistry(cfg.Registry.Name, cfg.Registry.Options, cfg.Source); err != nil {
		return p, err
	}
	p.built = append(p.built, p.registry)
	if side == ClientSide {
		if p.balancer, err = NewBalancer(cfg.Balancer.Name, cfg.Balancer.Options, cfg.Source); err != nil {
			return p, err
		}
		p.built = append(p.built, p.balancer)
	}
	for _, fc := range cfg.Filters {
		if fc.Side != "" && fc.Side != "both" && fc.Side != side.String() {
			continue
		}
		f, err := NewFilter(fc.Name, fc.Options, cfg.Source)
		if err != nil {
			return p, err
		}
		p.filters = append(p.filters, configuredFilter{filter: f, methods: fc.Methods})
		p.built = append(p.built, f)
	}
	return p, nil
}

// close closes every plugin that implements io.Closer.
func (p *plugins) close(log *slog.Logger) {
	for _, b := range p.built {
		if c, ok := b.(io.Closer); ok {
			if err := c.Close(); err != nil {
				log.Warn("closing plugin", "plugin", fmt.Sprintf("%T", b), "err", err)
			}
		}
	}
}
