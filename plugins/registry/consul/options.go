package consul

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// Options configures a consul registry; the package doc lists them with
// their defaults.
type Options struct {
	// Address is the agent's HTTP address: host:port, unix:///path, or
	// http(s)://host:port. Empty means $CONSUL_HTTP_ADDR when set, else
	// 127.0.0.1:8500.
	Address string `json:"address"`
	// Scheme is http or https; empty takes it from Address, else http.
	Scheme string `json:"scheme"`
	// Token is the ACL token; empty falls back to $CONSUL_HTTP_TOKEN.
	Token string `json:"token" secret:"true"`
	// Datacenter is the datacenter to query; empty means the agent's.
	Datacenter string `json:"datacenter"`
	// TTL is the TTL check of a Register whose ttl is 0.
	TTL kernel.Duration `json:"ttl"`
	// DeregisterCriticalServiceAfter is how long an instance may stay
	// critical before the agent removes it. Consul enforces at least 1m
	// and reaps every 30s.
	DeregisterCriticalServiceAfter kernel.Duration `json:"deregister_critical_service_after"`
	// WaitTime is the longest wait of one blocking query.
	WaitTime kernel.Duration `json:"wait_time"`
	// Timeout bounds dialling and every request but the blocking queries
	// (which take up to WaitTime, plus Consul's jitter of WaitTime/16, plus
	// Timeout).
	Timeout kernel.Duration `json:"timeout"`
	// SessionTTL bounds how long a dead leader keeps its leadership. Consul
	// is asked for half of it (it invalidates a session at twice its TTL),
	// which must be at least the agent's session_ttl_min (10s by default).
	SessionTTL kernel.Duration `json:"session_ttl"`
	// LoadReportInterval bounds load writes: at most one per instance per
	// interval; reports in between are coalesced into the next write.
	LoadReportInterval kernel.Duration `json:"load_report_interval"`
	// TLS configures https.
	TLS TLSOptions `json:"tls"`
}

// TLSOptions configure https to the agent, as api.TLSConfig allows.
type TLSOptions struct {
	CAFile             string `json:"ca_file"`
	CAPath             string `json:"ca_path"`
	CertFile           string `json:"cert_file"`
	KeyFile            string `json:"key_file"`
	ServerName         string `json:"server_name"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify"`
}

func (t TLSOptions) set() bool { return t != TLSOptions{} }

// DefaultOptions returns the options with their defaults.
func DefaultOptions() *Options {
	return &Options{
		TTL:                            kernel.Duration(10 * time.Second),
		DeregisterCriticalServiceAfter: kernel.Duration(time.Minute),
		WaitTime:                       kernel.Duration(30 * time.Second),
		Timeout:                        kernel.Duration(5 * time.Second),
		SessionTTL:                     kernel.Duration(20 * time.Second),
		LoadReportInterval:             kernel.Duration(5 * time.Second),
	}
}

// maxWait is Consul's own cap on a blocking query's wait.
const maxWait = 10 * time.Minute

// config is Options checked and resolved.
type config struct {
	address    string // as given or resolved, for messages
	dialAddr   string // host:port, or a socket path when unix
	unix       bool
	scheme     string
	token      string
	datacenter string
	ttl        time.Duration
	deregAfter time.Duration
	waitTime   time.Duration
	timeout    time.Duration
	sessionTTL time.Duration
	loadEvery  time.Duration
	tls        TLSOptions
}

func (o Options) config() (config, error) {
	c := config{
		token: o.Token, datacenter: o.Datacenter, tls: o.TLS,
		ttl: o.TTL.D(), deregAfter: o.DeregisterCriticalServiceAfter.D(), waitTime: o.WaitTime.D(),
		timeout: o.Timeout.D(), sessionTTL: o.SessionTTL.D(), loadEvery: o.LoadReportInterval.D(),
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"ttl", c.ttl}, {"deregister_critical_service_after", c.deregAfter}, {"wait_time", c.waitTime},
		{"timeout", c.timeout}, {"session_ttl", c.sessionTTL}, {"load_report_interval", c.loadEvery}} {
		if d.v <= 0 {
			return config{}, fmt.Errorf("consul: option %q must be positive, got %s", d.key, d.v)
		}
	}
	if c.waitTime > maxWait {
		return config{}, fmt.Errorf("consul: option \"wait_time\" is %s; Consul caps a blocking query's wait at %s", c.waitTime, maxWait)
	}
	if c.deregAfter < c.ttl {
		return config{}, fmt.Errorf("consul: option \"deregister_critical_service_after\" (%s) is shorter than option \"ttl\" (%s): "+
			"an instance would be removed before its check could go critical", c.deregAfter, c.ttl)
	}
	if err := c.resolveAddress(o.Address, o.Scheme); err != nil {
		return config{}, err
	}
	if c.tls.set() && c.scheme != "https" {
		return config{}, errors.New("consul: option \"tls\" is set but the scheme is http; set option \"scheme\" to https (or give an https:// address)")
	}
	if (c.tls.CertFile == "") != (c.tls.KeyFile == "") {
		return config{}, errors.New("consul: option \"tls\": cert_file and key_file go together; set both or neither")
	}
	return c, nil
}

// resolveAddress picks the address (the option, else $CONSUL_HTTP_ADDR,
// else 127.0.0.1:8500) and the scheme, and checks both.
func (c *config) resolveAddress(addr, scheme string) error {
	key := "address"
	if addr == "" {
		if env := os.Getenv("CONSUL_HTTP_ADDR"); env != "" {
			addr, key = env, "address\" (from $CONSUL_HTTP_ADDR"
		} else {
			addr = "127.0.0.1:8500"
		}
	}
	c.address = addr
	fromAddr := ""
	rest := addr
	if i := strings.Index(addr, "://"); i >= 0 {
		fromAddr, rest = addr[:i], addr[i+3:]
	}
	switch fromAddr {
	case "":
	case "unix":
		if rest == "" {
			return fmt.Errorf("consul: option %q: %q names no socket path", key, addr)
		}
		c.unix, c.dialAddr = true, rest
	case "http", "https":
		if scheme != "" && scheme != fromAddr {
			return fmt.Errorf("consul: option \"scheme\" is %q but option %q says %q", scheme, key, fromAddr)
		}
		scheme = fromAddr
	default:
		return fmt.Errorf("consul: option %q: unknown scheme %q in %q (want host:port, http://, https:// or unix://)", key, fromAddr, addr)
	}
	if !c.unix {
		if strings.ContainsAny(rest, "/?#") {
			return fmt.Errorf("consul: option %q: %q has a path; give host:port (a path prefix behind a proxy is not supported)", key, addr)
		}
		if _, port, err := net.SplitHostPort(rest); err != nil || port == "" {
			return fmt.Errorf("consul: option %q: %q is not host:port", key, addr)
		}
		c.dialAddr = rest
	}
	switch scheme {
	case "":
		scheme = "http"
	case "http", "https":
	default:
		return fmt.Errorf("consul: option \"scheme\": %q is neither http nor https", scheme)
	}
	c.scheme = scheme
	return nil
}

// newClient builds the Consul client over a transport of its own, so that
// dialling is bounded by timeout and Close can drop idle connections.
func newClient(c config) (*api.Client, *http.Transport, error) {
	dialer := &net.Dialer{Timeout: c.timeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: c.timeout,
		MaxIdleConnsPerHost: 64, // one per blocking query loop, and writes beside them
		IdleConnTimeout:     90 * time.Second,
	}
	if c.unix {
		path := c.dialAddr
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		}
	}
	if c.scheme == "https" {
		tc, err := api.SetupTLSConfig(&api.TLSConfig{
			Address: c.tls.ServerName, CAFile: c.tls.CAFile, CAPath: c.tls.CAPath,
			CertFile: c.tls.CertFile, KeyFile: c.tls.KeyFile, InsecureSkipVerify: c.tls.InsecureSkipVerify,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("consul: option \"tls\": %w", err)
		}
		tr.TLSClientConfig = tc
	}
	host := c.dialAddr
	if c.unix {
		host = "localhost" // the transport dials the socket whatever the host
	}
	client, err := api.NewClient(&api.Config{
		Address:    host,
		Scheme:     c.scheme,
		Datacenter: c.datacenter,
		Token:      c.token,
		HttpClient: &http.Client{Transport: tr},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("consul: option \"address\": %w", err)
	}
	return client, tr, nil
}
