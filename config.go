package kernrpc

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Config composes a service from plugin names. It is usually read from one
// YAML or JSON file with LoadConfig. Every plugin is chosen by name and
// given its own options; a plugin without options may be named bare:
//
//	service: echo
//	address: 127.0.0.1:7000
//	transport: {name: tcp-lv, options: {max_frame_size: 4MiB}}
//	codec:     protobuf
//	registry:  memory
//	balancer:  round-robin
//	filters:
//	  - {name: require-metadata, side: server, methods: ["Echo.*"], options: {keys: [tenant]}}
type Config struct {
	// Service is the name the server registers and clients resolve.
	Service string `json:"service"`
	// Address is where the server listens. KERNRPC_ADDRESS overrides it.
	Address string `json:"address"`
	// Advertise is the address registered for clients to dial, when it
	// differs from the listener's. KERNRPC_ADVERTISE overrides it.
	Advertise string         `json:"advertise"`
	Transport PluginConfig   `json:"transport"`
	Codec     PluginConfig   `json:"codec"`
	Registry  PluginConfig   `json:"registry"`
	Balancer  PluginConfig   `json:"balancer"`
	Filters   []FilterConfig `json:"filters"`
	Server    ServerConfig   `json:"server"`
	Client    ClientConfig   `json:"client"`
	Streams   StreamConfig   `json:"streams"`
	// GCHeadroom is the heap the process keeps in reserve, unused, while a
	// Server or Client that has read a large message (32KiB or more) is
	// open, so that the Go collector runs less often: unset means
	// DefaultGCHeadroom (64MiB), 0 none. It is ignored when GOGC or
	// GOMEMLIMIT is set, and at most a sixteenth of a container's memory
	// limit. docs/performance.md ("GC headroom") has what it gains and
	// costs.
	GCHeadroom *kernel.Size `json:"gc_headroom"`

	// Source is the file the config came from, for error messages.
	Source string `json:"-"`
}

// PluginConfig picks one plugin by name and gives it options.
type PluginConfig struct {
	Name    string         `json:"name"`
	Options map[string]any `json:"options"`
}

// FilterConfig places one filter in the chain.
type FilterConfig struct {
	Name string `json:"name"`
	// Side is "client", "server" or "both" (the default). A filter that
	// works on one side only (kernel.SidedFilter: retry, hedge, breaker)
	// is left out of the other when Side is empty or "both", and naming
	// the other side is an error where that side is built.
	Side string `json:"side"`
	// Stage is, on the client, "call" (before the pick, once per call) or
	// "attempt" (after the pick, once per attempt). Empty: the stage the
	// filter declares (kernel.StagedFilter), else call.
	Stage string `json:"stage"`
	// Methods limits the filter to these methods; a trailing * matches a
	// prefix ("Echo.*"). Empty means every method. A pattern that is empty
	// or has a * before its end is an error (kernel.CheckMethodPattern);
	// one that matches none of a server's methods is logged at WARN when
	// the server starts.
	Methods []string       `json:"methods"`
	Options map[string]any `json:"options"`
}

// ServerConfig tunes the server side.
type ServerConfig struct {
	// ShutdownTimeout bounds how long Shutdown waits for in-flight calls.
	ShutdownTimeout kernel.Duration `json:"shutdown_timeout"`
	// RegisterTTL is the lease under which the instance is registered.
	RegisterTTL kernel.Duration `json:"register_ttl"`
	// InstanceID overrides the instance id registered (default: service@address).
	InstanceID string `json:"instance_id"`
	// Metadata is registered with the instance.
	Metadata map[string]string `json:"metadata"`
	// MaxConnections bounds the connections the server holds; one over it
	// is told so (a GoAway saying max_connections, naming no call served)
	// and closed as it is accepted. Default 10000.
	MaxConnections int `json:"max_connections"`
	// MaxConcurrentCalls bounds the calls one connection may have in
	// flight; one over it is refused with ResourceExhausted, unprocessed.
	// Default 1024.
	MaxConcurrentCalls int `json:"max_concurrent_calls"`
	// IdleTimeout is how long a connection may carry no call before the
	// server sends it a GoAway and closes it. Default 15m.
	IdleTimeout kernel.Duration `json:"idle_timeout"`
	// DrainPeriod is how long a server that begins a graceful shutdown
	// keeps serving after it has reported not serving and left the
	// registry, so that clients stop picking it before it sends its
	// GoAways. Part of the shutdown timeout. Default 0; with a registry
	// across machines, about the time it takes to tell its watchers (1-2s
	// for etcd or Consul).
	DrainPeriod kernel.Duration `json:"drain_period"`
	// LoadReportInterval is how often, at most, the server publishes its
	// in-flight calls and recent QPS into its registration, where the
	// registry supports it (kernel.LoadReporter); an unchanged load is not
	// written again. Default 5s; negative turns load reports off.
	LoadReportInterval kernel.Duration `json:"load_report_interval"`
	// AdminAddress, when set, serves the admin pages over HTTP there: an
	// index, /healthz, and the routes plugins offer (kernel.AdminHandler),
	// such as a metrics exporter's /metrics. Keep it off public networks.
	AdminAddress string `json:"admin_address"`
	// Reflection serves the reflection service,
	// kernrpc.reflection.v1.Reflection: it lists the server's services and
	// methods and returns their file descriptors, so that tools such as
	// "kernrpc list" and "kernrpc call" need no generated code
	// (docs/reflection.md). It tells callers every method's message types:
	// leave it off where that is not wanted. Default false.
	Reflection bool `json:"reflection"`
}

// ClientConfig tunes the client side.
type ClientConfig struct {
	// PoolSize is how many connections the client keeps per instance; calls
	// are multiplexed over them, in turn. Default 1.
	PoolSize int `json:"pool_size"`
	// MaxPoolSize is how many connections per instance the client may use
	// when calls carry large messages. A call whose connection has
	// SpreadBytes or more in flight (the requests sent and the answers
	// expected, sized from recent answers) takes the least loaded one
	// instead, and once every open connection is that loaded another is
	// dialled in the background, up to MaxPoolSize. One connection reads
	// one frame at a time on each side, so large frames queue behind each
	// other; small calls, which gain from sharing a connection's reads and
	// writes, stay on PoolSize connections. Default 2; at or below
	// PoolSize (1 with the default PoolSize), calls never spread.
	MaxPoolSize int `json:"max_pool_size"`
	// SpreadBytes is the load in flight on a connection past which calls
	// spread to another (see MaxPoolSize). Default 64KiB.
	SpreadBytes kernel.Size `json:"spread_bytes"`
	// Timeout applies to calls whose context has no deadline; 0 means none.
	Timeout kernel.Duration `json:"timeout"`
	// DialTimeout bounds connecting to an instance.
	DialTimeout kernel.Duration `json:"dial_timeout"`
	// Retries is how many times a call the server did not process (it was
	// shutting down, or could not be dialled) is sent again on another
	// connection. Default 2.
	Retries *int `json:"retries"`
	// WaitForReady makes a call that no instance could take (a refused
	// dial, a server shutting down) try again after growing pauses until
	// its deadline (or DialTimeout for a call without one), rather than
	// fail once Retries are spent: the gap while a lone server at a fixed
	// address restarts is then waited out. The call option WaitForReady
	// sets it for one call or stream. Default false: such a call fails at
	// once with Unavailable, so that a caller can go elsewhere.
	WaitForReady bool `json:"wait_for_ready"`
}

// StreamConfig sizes the flow-control windows of streaming calls, on
// both sides: how much a peer may send before this side's application has
// read it (docs/protocol.md, "Flow control").
type StreamConfig struct {
	// Window is what one stream may have in flight toward this side.
	// Default 1MiB: 16 messages of 64 KiB in flight.
	Window kernel.Size `json:"window"`
	// ConnectionWindow is what all the streams of one connection may have
	// in flight toward this side together: the most a peer can make this
	// side hold for streams whose application does not read; while such
	// streams hold most of it, the connection's other streams wait too
	// (docs/protocol.md, "Flow control"). Default 16MiB, or Window if that
	// is larger; at least Window.
	ConnectionWindow kernel.Size `json:"connection_window"`
}

// Defaults of StreamConfig.
const (
	DefaultStreamWindow     = 1 << 20
	DefaultConnectionWindow = 16 << 20
	maxWindow               = 1<<31 - 1 // credit travels as a uint32; keep well inside it
)

// poolLimit is how many connections per instance the client may use.
func (c *ClientConfig) poolLimit() int { return max(c.PoolSize, c.MaxPoolSize) }

// Defaults of ClientConfig's spreading over connections (MaxPoolSize).
const (
	DefaultMaxPoolSize = 2
	DefaultSpreadBytes = 64 << 10
)

// DefaultConfig returns a config with every default filled in.
func DefaultConfig() *Config {
	c := &Config{}
	c.applyDefaults()
	return c
}

func (c *Config) applyDefaults() {
	if c.Transport.Name == "" {
		c.Transport.Name = DefaultTransport
	}
	if c.Codec.Name == "" {
		c.Codec.Name = DefaultCodec
	}
	if c.Registry.Name == "" {
		c.Registry.Name = DefaultRegistry
	}
	if c.Balancer.Name == "" {
		c.Balancer.Name = DefaultBalancer
	}
	if c.Address == "" {
		c.Address = "127.0.0.1:0"
	}
	if c.Server.ShutdownTimeout == 0 {
		c.Server.ShutdownTimeout = kernel.Duration(10 * time.Second)
	}
	if c.Server.RegisterTTL == 0 {
		c.Server.RegisterTTL = kernel.Duration(10 * time.Second)
	}
	if c.Server.MaxConnections == 0 {
		c.Server.MaxConnections = 10000
	}
	if c.Server.MaxConcurrentCalls == 0 {
		c.Server.MaxConcurrentCalls = 1024
	}
	if c.Server.IdleTimeout == 0 {
		c.Server.IdleTimeout = kernel.Duration(15 * time.Minute)
	}
	if c.Server.LoadReportInterval == 0 {
		c.Server.LoadReportInterval = kernel.Duration(5 * time.Second)
	}
	if c.Client.PoolSize == 0 {
		c.Client.PoolSize = 1
	}
	if c.Client.MaxPoolSize == 0 {
		c.Client.MaxPoolSize = DefaultMaxPoolSize
	}
	if c.Client.SpreadBytes == 0 {
		c.Client.SpreadBytes = DefaultSpreadBytes
	}
	if c.Client.DialTimeout == 0 {
		c.Client.DialTimeout = kernel.Duration(5 * time.Second)
	}
	if c.Streams.Window == 0 {
		c.Streams.Window = DefaultStreamWindow
	}
	if c.Streams.ConnectionWindow == 0 {
		// At least one stream's window: a larger streams.window alone must
		// not fail on a key the config never wrote.
		c.Streams.ConnectionWindow = max(DefaultConnectionWindow, c.Streams.Window)
	}
	if c.Client.Retries == nil {
		two := 2
		c.Client.Retries = &two
	}
	if c.GCHeadroom == nil {
		h := kernel.Size(DefaultGCHeadroom)
		c.GCHeadroom = &h
	}
}

// validate checks the whole config: its fields, then every plugin it
// names. NewClient and NewServer check the fields alone, as building the
// plugins checks them.
func (c *Config) validate() error {
	if err := c.validateFields(); err != nil {
		return err
	}
	return c.checkPlugins()
}

// validateFields checks every field but the plugins' options.
func (c *Config) validateFields() error {
	if c.Client.PoolSize < 1 {
		return c.errorf("client.pool_size", "must be at least 1, got %d", c.Client.PoolSize)
	}
	if c.Client.MaxPoolSize < 0 {
		return c.errorf("client.max_pool_size", "must not be negative, got %d", c.Client.MaxPoolSize)
	}
	if c.Client.SpreadBytes < 0 {
		return c.errorf("client.spread_bytes", "must not be negative, got %d", c.Client.SpreadBytes)
	}
	if c.Client.Timeout < 0 {
		return c.errorf("client.timeout", "must not be negative, got %s", c.Client.Timeout)
	}
	if c.Client.DialTimeout < 0 {
		return c.errorf("client.dial_timeout", "must be positive, got %s (0 means the default, 5s)", c.Client.DialTimeout)
	}
	if h := *c.GCHeadroom; h < 0 || h > maxGCHeadroom {
		return c.errorf("gc_headroom", "must be between 0 (none) and 1GiB, got %s (unset means the default, 64MiB)", h)
	}
	if *c.Client.Retries < 0 {
		return c.errorf("client.retries", "must not be negative, got %d", *c.Client.Retries)
	}
	if c.Server.ShutdownTimeout < 0 {
		return c.errorf("server.shutdown_timeout", "must not be negative, got %s", c.Server.ShutdownTimeout)
	}
	if c.Server.RegisterTTL < 0 {
		return c.errorf("server.register_ttl", "must be positive, got %s (0 means the default, 10s)", c.Server.RegisterTTL)
	}
	if c.Server.MaxConnections < 0 {
		return c.errorf("server.max_connections", "must be positive, got %d (0 means the default, 10000)", c.Server.MaxConnections)
	}
	if c.Server.MaxConcurrentCalls < 0 {
		return c.errorf("server.max_concurrent_calls", "must be positive, got %d (0 means the default, 1024)", c.Server.MaxConcurrentCalls)
	}
	if c.Server.IdleTimeout < 0 {
		return c.errorf("server.idle_timeout", "must be positive, got %s (0 means the default, 15m)", c.Server.IdleTimeout)
	}
	if c.Server.DrainPeriod < 0 {
		return c.errorf("server.drain_period", "must not be negative, got %s", c.Server.DrainPeriod)
	}
	// maxWindow is 2GiB less one byte (credit travels below 2^31): the
	// message says "below 2GiB", since a user who writes 2GiB is refused.
	if w := c.Streams.Window; w < 1<<10 || w > maxWindow {
		return c.errorf("streams.window", "must be at least 1KiB and below 2GiB, got %s (0 means the default, 1MiB)", w)
	}
	if w := c.Streams.ConnectionWindow; w < c.Streams.Window || w > maxWindow {
		return c.errorf("streams.connection_window", "must be at least streams.window (%s) and below 2GiB, got %s (0 means the default, 16MiB or streams.window if larger)", c.Streams.Window, w)
	}
	for i, f := range c.Filters {
		if f.Name == "" {
			return c.errorf(fmt.Sprintf("filters[%d].name", i), "is empty; every filter is picked by name")
		}
		switch f.Side {
		case "", "both", "client", "server":
		default:
			return c.errorf(fmt.Sprintf("filters[%d].side", i), "is %q; want client, server or both", f.Side)
		}
		for j, m := range f.Methods {
			if err := kernel.CheckMethodPattern(m); err != nil {
				return c.errorf(fmt.Sprintf("filters[%d].methods[%d]", i, j), "is %q: %v; leave methods out for every method", m, err)
			}
		}
		switch {
		case f.Stage != "" && f.Stage != "call" && f.Stage != "attempt":
			return c.errorf(fmt.Sprintf("filters[%d].stage", i), "is %q; want call or attempt", f.Stage)
		case f.Stage != "" && f.Side == "server":
			return c.errorf(fmt.Sprintf("filters[%d].stage", i), "is %q, but the filter runs on the server, which has one stage; stages are for client filters", f.Stage)
		}
	}
	return nil
}

// checkPlugins looks up every plugin the config names and decodes its
// options, whichever side will use it: a server's config with a client
// balancer that does not exist fails when it is loaded, not on the first
// call of some later client.
func (c *Config) checkPlugins() error {
	var errs []error
	for _, p := range []struct {
		kind kernel.Kind
		cfg  PluginConfig
	}{{kernel.KindTransport, c.Transport}, {kernel.KindCodec, c.Codec}, {kernel.KindRegistry, c.Registry}, {kernel.KindBalancer, c.Balancer}} {
		if err := kernel.CheckOptions(p.kind, p.cfg.Name, p.cfg.Options, c.Source); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range c.Filters {
		if err := kernel.CheckOptions(kernel.KindFilter, f.Name, f.Options, c.Source); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// bareNames lets a config name a plugin without options as a bare string,
// the way people write it: "transport: tcp-lv" for "transport: {name:
// tcp-lv}", and "filters: [log]" for a filter.
func bareNames(tree map[string]any) map[string]any {
	out := make(map[string]any, len(tree))
	for k, v := range tree {
		out[k] = v
	}
	for _, k := range []string{"transport", "codec", "registry", "balancer"} {
		if name, ok := out[k].(string); ok {
			out[k] = map[string]any{"name": name}
		}
	}
	if list, ok := out["filters"].([]any); ok {
		named := make([]any, len(list))
		for i, f := range list {
			if name, ok := f.(string); ok {
				f = map[string]any{"name": name}
			}
			named[i] = f
		}
		out["filters"] = named
	}
	return out
}

func (c *Config) errorf(key, format string, args ...any) error {
	return fmt.Errorf("kernrpc: %s: %s %s", sourceOr(c.Source), key, fmt.Sprintf(format, args...))
}

// parseTree builds a Config from an already-parsed tree (from YAML or
// JSON). Strings may refer to the environment as ${VAR} or ${VAR:-default}
// (a string still: a field taking a number or a boolean cannot come from
// the environment); then KERNRPC_ADDRESS and KERNRPC_ADVERTISE override the addresses.
// Unknown keys and wrong types are errors naming the key and source.
func parseTree(tree map[string]any, source string) (*Config, error) {
	fromEnv := map[string]bool{}
	expanded, err := expandEnv(tree, "", fromEnv)
	if err != nil {
		return nil, fmt.Errorf("kernrpc: %s: %w", sourceOr(source), err)
	}
	c := &Config{}
	if err := kernel.DecodeOptions(bareNames(expanded.(map[string]any)), c); err != nil {
		key := kernel.OptionKey(err)
		if key != "" {
			return nil, envHint(fmt.Errorf("kernrpc: %s: key %q: %w", sourceOr(source), key, err), key, fromEnv)
		}
		return nil, fmt.Errorf("kernrpc: %s: %w", sourceOr(source), err)
	}
	c.Source = source
	if v := os.Getenv("KERNRPC_ADDRESS"); v != "" {
		c.Address = v
	}
	if v := os.Getenv("KERNRPC_ADVERTISE"); v != "" {
		c.Advertise = v
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		var pe *kernel.PluginError
		if errors.As(err, &pe) {
			return nil, envHint(err, cmp.Or(pe.Key, kernel.OptionKey(pe.Err)), fromEnv)
		}
		return nil, err
	}
	return c, nil
}

// envHint adds to err, a type error at key, why a value written as a
// number or a boolean arrived as a string: it came from the environment.
// A plugin's option key is matched by its last part.
func envHint(err error, key string, fromEnv map[string]bool) error {
	if key == "" || !strings.Contains(err.Error(), "got a string") {
		return err
	}
	for p := range fromEnv {
		if p == key || strings.HasSuffix(p, "."+key) {
			return fmt.Errorf("%w (a ${VAR} always gives a string: write a number or true/false in the file itself)", err)
		}
	}
	return err
}

// expandEnv expands the strings of v, the value at path, naming the
// key's full path ("filters[1].name") in an error, as decoding does, and
// noting in fromEnv the paths of the strings that named a variable.
func expandEnv(v any, path string, fromEnv map[string]bool) (any, error) {
	switch t := v.(type) {
	case string:
		s, err := expandString(t)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", path, err)
		}
		if strings.Contains(t, "${") {
			fromEnv[path] = true
		}
		return s, nil
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			x, err := expandEnv(e, join(path, k), fromEnv)
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			x, err := expandEnv(e, path+"["+strconv.Itoa(i)+"]", fromEnv)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	return v, nil
}

// expandString replaces ${VAR} and ${VAR:-default}. A ${VAR} whose variable
// is unset is an error, so a typo does not silently become an empty address;
// so is a default that holds a ${, which is not expanded again.
func expandString(s string) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("unterminated ${ in %q", s)
		}
		expr := s[i+2 : i+j]
		name, def, hasDef := strings.Cut(expr, ":-")
		switch {
		case name == "":
			return "", fmt.Errorf("${%s} names no environment variable", expr)
		case strings.Contains(def, "${"):
			// The default ends at the first }: "${A:-${B}}" would give "${B}".
			return "", fmt.Errorf("the default of ${%s:-...} holds a ${: a default is taken as written, it cannot name another variable", name)
		}
		val, ok := os.LookupEnv(name)
		switch {
		case ok && val != "":
			b.WriteString(val)
		case hasDef:
			b.WriteString(def)
		case ok:
			return "", fmt.Errorf("environment variable %s is empty (use ${%s:-default} for a fallback)", name, name)
		default:
			return "", fmt.Errorf("environment variable %s is not set (use ${%s:-default} for a fallback)", name, name)
		}
		s = s[i+j+1:]
	}
}

// sourceOr names where a config came from, for errors.
func sourceOr(s string) string {
	if s == "" {
		return "options given in code"
	}
	return s
}
