package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/kernel"
)

// dialFlags are the flags of the commands that reach a server by address
// or by service name: list, describe, call, bench.
type dialFlags struct {
	config   string
	registry string
	codec    string
	protoset string
	timeout  time.Duration
	headers  metadataFlag
}

func (d *dialFlags) add(fs *flag.FlagSet, calls bool) {
	fs.StringVar(&d.config, "config", "", "config file naming the transport, codec, registry and client filters (default: the built-in defaults)")
	fs.StringVar(&d.registry, "registry", "", `registry to resolve a service name through, as a config's registry line: a name ("etcd") or "{name: etcd, options: {endpoints: [127.0.0.1:2379]}}"`)
	fs.StringVar(&d.protoset, "protoset", "", "read descriptors from this descriptor set file (protoc --descriptor_set_out --include_imports) instead of the server's reflection")
	d.timeout = 5 * time.Second
	fs.Var((*timeoutFlag)(&d.timeout), "timeout", "give up on each call after this `duration`")
	// list and describe take -H too: a server may guard its reflection
	// service with the token its other methods want.
	fs.Var(&d.headers, "H", "metadata key=value to send with each call, reflection lookups included (repeatable)")
	if calls {
		fs.StringVar(&d.codec, "codec", "", "codec to call in: protobuf or json (default: the config's, else protobuf)")
	}
}

// isAddress tells an address (host:port, shm-ring:///path) from a
// service name, which has neither a colon nor a slash.
func isAddress(target string) bool { return strings.ContainsAny(target, ":/") }

// endpoint is a client of one target, and where its descriptors come from.
type endpoint struct {
	cfg    *kernrpc.Config
	cli    *kernrpc.Client
	what   string // the target, for messages
	source generic.Source
}

func (e *endpoint) Close() { e.cli.Close() }

// dial builds a client of target: an address, or with -config or
// -registry, a service name resolved through that registry.
func (d *dialFlags) dial(target string) (*endpoint, error) {
	cfg, err := d.baseConfig()
	if err != nil {
		return nil, err
	}
	what := target
	switch {
	case isAddress(target):
		if cfg.Service == "" {
			cfg.Service = "kernrpc-cli"
		}
		cfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{
			"namespace": "kernrpc-cli", "static": map[string]any{cfg.Service: []any{target}}}}
	case d.config == "" && d.registry == "":
		return nil, fmt.Errorf("%q is not an address (HOST:PORT); to resolve a service name, pass -registry or -config naming the registry", target)
	default:
		cfg.Service = target
		what = fmt.Sprintf("service %q through registry %s", target, cfg.Registry.Name)
		if cfg.Registry.Name == "memory" && !listsStatic(cfg.Registry.Options, target) {
			return nil, fmt.Errorf("cannot resolve %q: registry \"memory\" lives inside one process and lists no static address for it; pass the address instead, or a -registry other processes share (etcd, consul)", target)
		}
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return nil, err
	}
	// The reflection lookups carry -H too: a server may guard its
	// reflection service as it does any other method.
	e := &endpoint{cfg: cfg, cli: cli, what: what, source: generic.NewReflectionSource(cli, d.callOptions()...)}
	if d.protoset != "" {
		src, err := generic.LoadDescriptorSet(d.protoset)
		if err != nil {
			cli.Close()
			return nil, err
		}
		e.source = src
	}
	return e, nil
}

// baseConfig is the config's, with -registry and -codec applied; a codec
// that cannot encode messages built from descriptors gives way to
// protobuf, which every server decodes.
func (d *dialFlags) baseConfig() (*kernrpc.Config, error) {
	cfg := kernrpc.DefaultConfig()
	if d.config != "" {
		var err error
		if cfg, err = kernrpc.LoadConfig(d.config); err != nil {
			return nil, err
		}
	}
	if d.registry != "" {
		reg, err := kernrpc.ParseConfig([]byte("registry: "+d.registry+"\n"), "-registry.yaml")
		if err != nil {
			return nil, err
		}
		cfg.Registry = reg.Registry
	}
	switch d.codec {
	case "":
		if c := cfg.Codec.Name; c != "" && c != "protobuf" && c != "json" {
			cfg.Codec = kernrpc.PluginConfig{Name: kernrpc.DefaultCodec}
		}
	case "protobuf", "json":
		cfg.Codec = kernrpc.PluginConfig{Name: d.codec}
	default:
		return nil, fmt.Errorf("-codec %q: messages built from descriptors are encoded by protobuf or json only (the server answers in whichever the call uses)", d.codec)
	}
	// A config's filters apply (auth, retries); the server's do not.
	return cfg, nil
}

func (d *dialFlags) callOptions() []kernrpc.CallOption {
	opts := []kernrpc.CallOption{kernrpc.CallTimeout(d.timeout)}
	if len(d.headers) > 0 {
		opts = append(opts, kernrpc.CallMetadata(kernel.Metadata(d.headers)))
	}
	return opts
}

// sourceOnly is a descriptor source without a server: -protoset with no
// target given.
func (d *dialFlags) sourceOnly() (generic.Source, error) {
	if d.protoset == "" {
		return nil, errors.New("no server to ask: pass ADDR (a server with server.reflection on, as kernrpc serve runs) or -protoset FILE")
	}
	return generic.LoadDescriptorSet(d.protoset)
}

// statusError prints a call's status as code and message.
type statusError struct {
	method string
	st     *kernel.Status
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s failed\n  code:    %s\n  message: %s", e.method, e.st.Code, e.st.Message)
}

func (e *statusError) Unwrap() error { return e.st }

// callError is err from calling method, with a status shown as its code
// and message, and a hint where one helps.
func (e *endpoint) callError(method string, err error) error {
	var st *kernel.Status
	if errors.As(err, &st) {
		if st.Code == kernel.Unavailable && !isAddress(e.what) {
			return fmt.Errorf("%w\n(no instance answered; to call one server directly, pass its address)", &statusError{method, st})
		}
		return &statusError{method, st}
	}
	return err
}

// ctxFor bounds a command with no deadline of its own by timeout.
func ctxFor(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, timeout)
}
