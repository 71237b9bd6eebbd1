package kernel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config composes a service from plugin names. It is usually read from one
// YAML or JSON file (the kernel takes the already-parsed tree, so that the
// YAML library stays out of the kernel: see the kernrpc package's
// LoadConfig). Every plugin is chosen by name and given its own options:
//
//	service: echo
//	address: 127.0.0.1:7000
//	transport: {name: tcp-lv, options: {max_frame_size: 4MiB}}
//	codec:     {name: protobuf}
//	registry:  {name: memory}
//	balancer:  {name: round-robin}
//	filters:
//	  - {name: token-bucket, side: server, methods: ["Echo.*"], options: {rate: 1000}}
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
	// Side is "client", "server" or "both" (the default).
	Side string `json:"side"`
	// Methods limits the filter to these methods; a trailing * matches a
	// prefix ("Echo.*"). Empty means every method.
	Methods []string       `json:"methods"`
	Options map[string]any `json:"options"`
}

// ServerConfig tunes the server side.
type ServerConfig struct {
	// ShutdownTimeout bounds how long Shutdown waits for in-flight calls.
	ShutdownTimeout Duration `json:"shutdown_timeout"`
	// RegisterTTL is the lease under which the instance is registered.
	RegisterTTL Duration `json:"register_ttl"`
	// InstanceID overrides the instance id registered (default: service@address).
	InstanceID string `json:"instance_id"`
	// Metadata is registered with the instance.
	Metadata map[string]string `json:"metadata"`
}

// ClientConfig tunes the client side.
type ClientConfig struct {
	// PoolSize is how many connections the client keeps per instance; calls
	// are multiplexed over them. Default 1.
	PoolSize int `json:"pool_size"`
	// Timeout applies to calls whose context has no deadline; 0 means none.
	Timeout Duration `json:"timeout"`
	// DialTimeout bounds connecting to an instance.
	DialTimeout Duration `json:"dial_timeout"`
	// Retries is how many times a call the server did not process (it was
	// shutting down) is sent again on another connection. Default 2.
	Retries *int `json:"retries"`
}

// Default plugin names, used when a config leaves a kind out.
const (
	DefaultTransport = "tcp-lv"
	DefaultCodec     = "protobuf"
	DefaultRegistry  = "memory"
	DefaultBalancer  = "round-robin"
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
		c.Server.ShutdownTimeout = Duration(10 * time.Second)
	}
	if c.Server.RegisterTTL == 0 {
		c.Server.RegisterTTL = Duration(10 * time.Second)
	}
	if c.Client.PoolSize == 0 {
		c.Client.PoolSize = 1
	}
	if c.Client.DialTimeout == 0 {
		c.Client.DialTimeout = Duration(5 * time.Second)
	}
	if c.Client.Retries == nil {
		two := 2
		c.Client.Retries = &two
	}
}

func (c *Config) validate() error {
	if c.Client.PoolSize < 1 {
		return c.errorf("client.pool_size", "must be at least 1, got %d", c.Client.PoolSize)
	}
	if c.Client.Timeout < 0 {
		return c.errorf("client.timeout", "must not be negative, got %s", c.Client.Timeout)
	}
	if *c.Client.Retries < 0 {
		return c.errorf("client.retries", "must not be negative, got %d", *c.Client.Retries)
	}
	if c.Server.ShutdownTimeout < 0 {
		return c.errorf("server.shutdown_timeout", "must not be negative, got %s", c.Server.ShutdownTimeout)
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
	}
	return nil
}

func (c *Config) errorf(key, format string, args ...any) error {
	return fmt.Errorf("kernrpc: %s: %s %s", sourceOr(c.Source), key, fmt.Sprintf(format, args...))
}

// ParseConfig builds a Config from an already-parsed tree (from YAML or
// JSON). Strings may refer to the environment as ${VAR} or ${VAR:-default};
// then KERNRPC_ADDRESS and KERNRPC_ADVERTISE override the addresses.
// Unknown keys and wrong types are errors naming the key and source.
func ParseConfig(tree map[string]any, source string) (*Config, error) {
	expanded, err := expandEnv(tree)
	if err != nil {
		return nil, fmt.Errorf("kernrpc: %s: %w", sourceOr(source), err)
	}
	c := &Config{}
	if err := DecodeOptions(expanded.(map[string]any), c); err != nil {
		key := optionKeyOf(err)
		if key != "" {
			return nil, fmt.Errorf("kernrpc: %s: key %q: %w", sourceOr(source), key, err)
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
		return nil, err
	}
	return c, nil
}

// ParseConfigJSON parses a JSON config; see ParseConfig.
func ParseConfigJSON(data []byte, source string) (*Config, error) {
	var tree map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("kernrpc: %s: %w", sourceOr(source), err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("kernrpc: %s: data after the config object; a config file holds one JSON object", sourceOr(source))
	}
	if tree == nil {
		tree = map[string]any{}
	}
	return ParseConfig(tree, source)
}

func expandEnv(v any) (any, error) {
	switch t := v.(type) {
	case string:
		return expandString(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			x, err := expandEnv(e)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", k, err)
			}
			out[k] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			x, err := expandEnv(e)
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
// is unset is an error, so a typo does not silently become an empty address.
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
		val, ok := os.LookupEnv(name)
		switch {
		case ok && val != "":
			b.WriteString(val)
		case hasDef:
			b.WriteString(def)
		default:
			return "", fmt.Errorf("environment variable %s is not set (use ${%s:-default} for a fallback)", name, name)
		}
		s = s[i+j+1:]
	}
}

// DecodeOptions decodes a parsed config tree into opts (a pointer to a
// struct with json tags) strictly: an unknown key or a wrong type is an
// error naming the key. Plugins rarely call it: the kernel does, with the
// plugin's defaults, before New.
func DecodeOptions(tree map[string]any, opts any) error {
	if len(tree) == 0 {
		return nil
	}
	data, err := json.Marshal(tree)
	if err != nil {
		return fmt.Errorf("options cannot be encoded: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(opts); err != nil {
		return explainDecodeError(err, opts)
	}
	return nil
}

// decodeError is a strict-decoding failure with the key it concerns.
type decodeError struct {
	key string
	msg string
	err error
}

func (e *decodeError) Error() string { return e.msg }
func (e *decodeError) Unwrap() error { return e.err }

func explainDecodeError(err error, opts any) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Type == reflect.TypeFor[Duration]() || te.Type == reflect.TypeFor[Size]() || te.Type == reflect.TypeFor[Code]() {
			// Their UnmarshalJSON put the whole explanation in Value.
			return &decodeError{key: te.Field, err: err, msg: te.Value}
		}
		return &decodeError{key: te.Field, err: err,
			msg: fmt.Sprintf("wrong type: got %s %s, want %s", article(te.Value), te.Value, describeType(te.Type))}
	}
	if key, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		key, _ = strconv.Unquote(key)
		return &decodeError{key: key, err: err,
			msg: fmt.Sprintf("unknown key (known keys: %s)", strings.Join(knownKeys(opts), ", "))}
	}
	return err
}

func article(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an"
	}
	return "a"
}

// valueError reports a config value of type t that does not parse. It is a
// *json.UnmarshalTypeError so that encoding/json fills in the key's path.
func valueError(t reflect.Type, format string, args ...any) error {
	return &json.UnmarshalTypeError{Value: fmt.Sprintf(format, args...), Type: t}
}

func optionKeyOf(err error) string {
	var de *decodeError
	if errors.As(err, &de) {
		return de.key
	}
	return ""
}

func describeType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[Duration]():
		return `a duration such as "500ms" or "5s"`
	case reflect.TypeFor[Size]():
		return `a size such as 4096 or "4MiB"`
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

func knownKeys(opts any) []string {
	var keys []string
	for key := range OptionFields(opts) {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys
}

// OptionFields yields each key a config may set in opts (a plugin's
// options struct, or a pointer to one) with the type its value decodes
// into, in field order: the keys strict decoding knows.
func OptionFields(opts any) iter.Seq2[string, reflect.Type] {
	return func(yield func(string, reflect.Type) bool) {
		t := reflect.TypeOf(opts)
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == nil || t.Kind() != reflect.Struct {
			return
		}
		for f := range t.Fields() {
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if !yield(name, f.Type) {
				return
			}
		}
	}
}

// Duration is a time.Duration that config files write as "500ms" or "5s".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a string such as "5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "5s"-style strings; a bare 0 is accepted too.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "0" {
		*d = 0
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return valueError(reflect.TypeFor[Duration](), `duration %s must be a string with a unit, such as "500ms" or "5s"`, b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return valueError(reflect.TypeFor[Duration](), `bad duration %q: want a number with a unit, such as "500ms" or "5s"`, s)
	}
	*d = Duration(v)
	return nil
}

// Size is a byte count that config files write as 4194304 or "4MiB".
type Size int64

// MarshalJSON writes s the way a person would in a config file: "4MiB" or
// "64KiB" when it is a whole number of those, else an integer.
func (s Size) MarshalJSON() ([]byte, error) {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && int64(s)%u.mult == 0 {
			return []byte(`"` + strconv.FormatInt(int64(s)/u.mult, 10) + u.suffix + `"`), nil
		}
	}
	return []byte(strconv.FormatInt(int64(s), 10)), nil
}

// UnmarshalJSON reads an integer or a string with a unit: B, KiB, MiB, GiB
// (powers of 1024) or KB, MB, GB (powers of 1000).
func (s *Size) UnmarshalJSON(b []byte) error {
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		if n < 0 {
			return valueError(reflect.TypeFor[Size](), "size %d must not be negative", n)
		}
		*s = Size(n)
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return valueError(reflect.TypeFor[Size](), `size %s must be an integer or a string such as "4MiB"`, b)
	}
	v, err := ParseSize(str)
	if err != nil {
		return valueError(reflect.TypeFor[Size](), "%s", err.Error())
	}
	*s = Size(v)
	return nil
}

// ParseSize parses "4MiB", "64KiB", "1GB" or a plain integer.
func ParseSize(str string) (int64, error) {
	t := strings.TrimSpace(str)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf(`bad size %q: want a non-negative integer with an optional unit B, KiB, MiB, GiB, KB, MB or GB`, str)
	}
	return n * mult, nil
}
