package kernel

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Kind names a kind of plugin.
type Kind string

const (
	KindTransport Kind = "transport"
	KindCodec     Kind = "codec"
	KindRegistry  Kind = "registry"
	KindBalancer  Kind = "balancer"
	KindFilter    Kind = "filter"
)

// Factory says how to build one plugin of kind T from its config: the
// plugin's name, its options with defaults, and a constructor. A plugin
// package declares one and registers it from init:
//
//	func init() { kernel.RegisterTransport(Factory) }
//
// Registration happens in init and is not safe to call afterwards.
type Factory[T any] struct {
	// Name is the config name, e.g. "tcp-lv".
	Name string
	// Doc is one line for `kernrpc plugins`.
	Doc string
	// NewOptions returns a pointer to the plugin's options filled with
	// defaults; the config's options block is decoded into it strictly. Nil
	// when the plugin takes no options.
	NewOptions func() any
	// New builds the plugin from what NewOptions returned, after decoding.
	// It validates the options and names the bad one in its error.
	New func(opts any) (T, error)
}

// NewFactory builds a Factory from typed functions, so that a plugin's
// constructor takes its own options type instead of any.
func NewFactory[T any, O any](name, doc string, defaults func() *O, build func(*O) (T, error)) Factory[T] {
	return Factory[T]{
		Name:       name,
		Doc:        doc,
		NewOptions: func() any { return defaults() },
		New: func(opts any) (T, error) {
			o, ok := opts.(*O)
			if !ok {
				var zero T
				return zero, fmt.Errorf("kernrpc: %s: options are %T, want %T", name, opts, (*O)(nil))
			}
			return build(o)
		},
	}
}

// pluginTable holds the factories of one kind.
type pluginTable[T any] struct {
	kind Kind
	mu   sync.RWMutex
	m    map[string]Factory[T]
}

func (t *pluginTable[T]) register(f Factory[T]) {
	if f.Name == "" {
		panic("kernrpc: Register" + string(t.kind) + ": empty plugin name")
	}
	if f.New == nil {
		panic("kernrpc: Register" + string(t.kind) + ": plugin " + f.Name + " has a nil New")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]Factory[T])
	}
	if _, dup := t.m[f.Name]; dup {
		panic("kernrpc: Register" + string(t.kind) + " called twice for " + string(t.kind) + " " + f.Name)
	}
	t.m[f.Name] = f
}

func (t *pluginTable[T]) lookup(name string) (Factory[T], error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	f, ok := t.m[name]
	if !ok {
		return f, &UnknownPluginError{Kind: t.kind, Name: name, Known: t.namesLocked()}
	}
	return f, nil
}

func (t *pluginTable[T]) namesLocked() []string {
	names := make([]string, 0, len(t.m))
	for n := range t.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (t *pluginTable[T]) infos() []PluginInfo {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []PluginInfo
	for _, n := range t.namesLocked() {
		f := t.m[n]
		info := PluginInfo{Kind: t.kind, Name: f.Name, Doc: f.Doc}
		if f.NewOptions != nil {
			info.Defaults = f.NewOptions()
		}
		out = append(out, info)
	}
	return out
}

// build looks name up and builds it from options.
func (t *pluginTable[T]) build(name string, options map[string]any, source string) (T, error) {
	f, err := t.lookup(name)
	if err != nil {
		var zero T
		return zero, &PluginError{Source: source, Kind: t.kind, Name: name, Err: err}
	}
	return f.build(t.kind, options, source)
}

// check looks name up and decodes options without building.
func (t *pluginTable[T]) check(name string, options map[string]any, source string) error {
	f, err := t.lookup(name)
	if err != nil {
		return &PluginError{Source: source, Kind: t.kind, Name: name, Err: err}
	}
	_, err = f.decode(t.kind, options, source)
	return err
}

// Build decodes options (an already-parsed config tree; nil for defaults)
// strictly into the factory's defaults and builds the plugin, the way a
// config naming it would. It serves plugins that are not registered, such
// as one under test in plugintest. source names where the options came
// from, for error messages.
func (f Factory[T]) Build(options map[string]any, source string) (T, error) {
	return f.build(kindOf[T](), options, source)
}

// decode returns the factory's defaults with options decoded over them.
func (f Factory[T]) decode(kind Kind, options map[string]any, source string) (any, error) {
	if f.NewOptions == nil {
		if len(options) > 0 {
			keys := make([]string, 0, len(options))
			for k := range options {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			return nil, &PluginError{Source: source, Kind: kind, Name: f.Name, Key: keys[0], Err: fmt.Errorf("unknown key: %s %q takes no options", kind, f.Name)}
		}
		return nil, nil
	}
	opts := f.NewOptions()
	if err := DecodeOptions(options, opts); err != nil {
		return nil, &PluginError{Source: source, Kind: kind, Name: f.Name, Err: err}
	}
	return opts, nil
}

func (f Factory[T]) build(kind Kind, options map[string]any, source string) (T, error) {
	var zero T
	if f.New == nil {
		return zero, &PluginError{Source: source, Kind: kind, Name: f.Name, Err: fmt.Errorf("its factory has a nil New")}
	}
	opts, err := f.decode(kind, options, source)
	if err != nil {
		return zero, err
	}
	p, err := f.New(opts)
	if err != nil {
		return zero, &PluginError{Source: source, Kind: kind, Name: f.Name, Err: err}
	}
	return p, nil
}

// kindOf names the plugin kind of T, for errors.
func kindOf[T any]() Kind {
	var zero T
	switch any(&zero).(type) {
	case *Transport:
		return KindTransport
	case *Codec:
		return KindCodec
	case *Registry:
		return KindRegistry
	case *Balancer:
		return KindBalancer
	case *Filter:
		return KindFilter
	}
	return Kind("plugin")
}

func sourceOr(s string) string {
	if s == "" {
		return "options given in code"
	}
	return s
}

var (
	transports = pluginTable[Transport]{kind: KindTransport}
	codecs     = pluginTable[Codec]{kind: KindCodec}
	registries = pluginTable[Registry]{kind: KindRegistry}
	balancers  = pluginTable[Balancer]{kind: KindBalancer}
	filters    = pluginTable[Filter]{kind: KindFilter}
)

// RegisterTransport makes a transport available by name. It panics if the
// name is empty or already taken, as database/sql.Register does.
func RegisterTransport(f Factory[Transport]) { transports.register(f) }

// RegisterCodec makes a codec available by name.
func RegisterCodec(f Factory[Codec]) { codecs.register(f) }

// RegisterRegistry makes a service registry available by name.
func RegisterRegistry(f Factory[Registry]) { registries.register(f) }

// RegisterBalancer makes a balancer available by name. Its New is called
// once per target service a client calls.
func RegisterBalancer(f Factory[Balancer]) { balancers.register(f) }

// RegisterFilter makes a filter available by name.
func RegisterFilter(f Factory[Filter]) { filters.register(f) }

// NewTransport builds the transport registered as name from options (an
// already-parsed config tree; nil for defaults). source names the file the
// options came from, for error messages.
func NewTransport(name string, options map[string]any, source string) (Transport, error) {
	return transports.build(name, options, source)
}

// NewCodec builds the codec registered as name.
func NewCodec(name string, options map[string]any, source string) (Codec, error) {
	return codecs.build(name, options, source)
}

// NewRegistry builds the service registry registered as name.
func NewRegistry(name string, options map[string]any, source string) (Registry, error) {
	return registries.build(name, options, source)
}

// NewBalancer builds the balancer registered as name.
func NewBalancer(name string, options map[string]any, source string) (Balancer, error) {
	return balancers.build(name, options, source)
}

// NewFilter builds the filter registered as name.
func NewFilter(name string, options map[string]any, source string) (Filter, error) {
	return filters.build(name, options, source)
}

// PluginInfo describes one registered plugin, for listings.
type PluginInfo struct {
	Kind     Kind
	Name     string
	Doc      string
	Defaults any // the options struct with its defaults; nil if none
}

// Plugins lists every registered plugin, by kind then name.
func Plugins() []PluginInfo {
	var out []PluginInfo
	out = append(out, transports.infos()...)
	out = append(out, codecs.infos()...)
	out = append(out, registries.infos()...)
	out = append(out, balancers.infos()...)
	out = append(out, filters.infos()...)
	return out
}

// UnknownPluginError is the cause of a PluginError when a config names a
// plugin nobody registered. It lists what is known and hints at the
// forgotten import.
type UnknownPluginError struct {
	Kind  Kind
	Name  string
	Known []string
}

func (e *UnknownPluginError) Error() string {
	known := "none is registered"
	if len(e.Known) > 0 {
		known = "known: " + strings.Join(e.Known, ", ")
	}
	return fmt.Sprintf("no %s of that name is registered (%s); forgotten import? Import the plugin's package for its side effect, "+
		"or _ \"github.com/kernrpc/kernrpc/plugins/all\" for every built-in plugin", e.Kind, known)
}

// PluginError is the one shape of every error about a plugin a config
// names: an unknown name, an option that does not fit, an error from the
// plugin's New or from using it. It reads
//
//	kernrpc: svc.yaml: transport "tcp-lv": option "max_frame_size": ...
//
// naming the config file, the plugin and, when known, the option, once
// each: a plugin's own prefix ("tcp-lv: ...") is not repeated.
type PluginError struct {
	Source string // the config file; "" for options given in code
	Kind   Kind
	Name   string
	Key    string // the option concerned, when known
	Err    error
}

func (e *PluginError) Error() string {
	return "kernrpc: " + sourceOr(e.Source) + ": " + e.Detail()
}

// Detail is the error without the config file: the plugin, the option
// when known, and the cause, as a status message about a running plugin
// (a failed dial, say) reads.
func (e *PluginError) Detail() string {
	key := e.Key
	if key == "" {
		key = OptionKey(e.Err)
	}
	var b strings.Builder
	b.WriteString(string(e.Kind))
	b.WriteString(" ")
	b.WriteString(strconv.Quote(e.Name))
	if key != "" {
		b.WriteString(": option ")
		b.WriteString(strconv.Quote(key))
	}
	b.WriteString(": ")
	b.WriteString(trimPrefixes(e.Err.Error(), e.Name))
	return b.String()
}

func (e *PluginError) Unwrap() error { return e.Err }

// trimPrefixes removes the "kernrpc: " and "<name>: " prefixes that
// wrapped errors accumulate, so that a message wrapping another names
// each thing once.
func trimPrefixes(msg, name string) string {
	for {
		switch {
		case strings.HasPrefix(msg, "kernrpc: "):
			msg = msg[len("kernrpc: "):]
		case name != "" && strings.HasPrefix(msg, name+": "):
			msg = msg[len(name)+2:]
		default:
			return msg
		}
	}
}

// CheckOptions looks name up among the plugins of kind and decodes options
// into its defaults without building it, so that a config can be checked
// whole when it is loaded, whichever side will use each plugin. Its error
// is a *PluginError.
func CheckOptions(kind Kind, name string, options map[string]any, source string) error {
	var err error
	switch kind {
	case KindTransport:
		err = transports.check(name, options, source)
	case KindCodec:
		err = codecs.check(name, options, source)
	case KindRegistry:
		err = registries.check(name, options, source)
	case KindBalancer:
		err = balancers.check(name, options, source)
	case KindFilter:
		err = filters.check(name, options, source)
	default:
		err = &PluginError{Source: source, Kind: kind, Name: name, Err: fmt.Errorf("no such plugin kind")}
	}
	return err
}
