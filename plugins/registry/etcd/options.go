package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kernrpc/kernrpc/kernel"
)

// Options configures an etcd registry. The package doc lists every key with
// its default.
type Options struct {
	// Endpoints are the etcd members to dial, host:port or a URL.
	Endpoints []string `json:"endpoints"`
	// DialTimeout bounds connecting, and every single request to etcd that a
	// call waits on, so that a dead cluster is an error, not a hang.
	DialTimeout kernel.Duration `json:"dial_timeout"`
	// TTL is the lease of a Register given a ttl of 0, and of the sessions
	// elections run on.
	TTL kernel.Duration `json:"ttl"`
	// Prefix is where instances live: <prefix><service>/<instance-id>.
	Prefix string `json:"prefix"`
	// ElectionPrefix is where elections live: <election_prefix><election>/.
	ElectionPrefix string `json:"election_prefix"`
	// SharedPrefix is where the shared store's entries live
	// (kernel.SharedStore): <shared_prefix><key>.
	SharedPrefix string `json:"shared_prefix"`
	// Username and Password authenticate to etcd; both or neither.
	Username string `json:"username"`
	Password string `json:"password" secret:"true"`
	// TLS secures the connection; nil (the default) is plain TCP.
	TLS *TLSOptions `json:"tls"`
	// LoadReportInterval is the least time between two writes of one
	// instance's load: a faster ReportLoad is coalesced.
	LoadReportInterval kernel.Duration `json:"load_report_interval"`
}

// TLSOptions are the files and checks of a TLS connection to etcd.
type TLSOptions struct {
	CAFile             string `json:"ca_file"`              // PEM roots to verify the server with; the system's when empty
	CertFile           string `json:"cert_file"`            // PEM client certificate, with key_file
	KeyFile            string `json:"key_file"`             // PEM key of cert_file
	ServerName         string `json:"server_name"`          // name to verify in the server's certificate
	InsecureSkipVerify bool   `json:"insecure_skip_verify"` // do not verify the server: tests only
}

// Defaults of the options.
const (
	DefaultEndpoint           = "127.0.0.1:2379"
	DefaultDialTimeout        = 5 * time.Second
	DefaultTTL                = 10 * time.Second
	DefaultPrefix             = "/kernrpc/services/"
	DefaultElectionPrefix     = "/kernrpc/elections/"
	DefaultSharedPrefix       = "/kernrpc/shared/"
	DefaultLoadReportInterval = 5 * time.Second
)

// DefaultOptions returns the options with their defaults.
func DefaultOptions() *Options {
	return &Options{
		Endpoints:          []string{DefaultEndpoint},
		DialTimeout:        kernel.Duration(DefaultDialTimeout),
		TTL:                kernel.Duration(DefaultTTL),
		Prefix:             DefaultPrefix,
		ElectionPrefix:     DefaultElectionPrefix,
		SharedPrefix:       DefaultSharedPrefix,
		LoadReportInterval: kernel.Duration(DefaultLoadReportInterval),
	}
}

// check validates o and returns it normalised: prefixes end in "/".
func (o Options) check() (Options, error) {
	if len(o.Endpoints) == 0 {
		return o, fmt.Errorf(`%s: option "endpoints" is empty; give at least one host:port, or leave it out for [%s]`, Name, DefaultEndpoint)
	}
	for i, e := range o.Endpoints {
		if strings.TrimSpace(e) == "" {
			return o, fmt.Errorf(`%s: option "endpoints": endpoint %d is empty`, Name, i)
		}
	}
	for _, d := range []struct {
		key string
		v   kernel.Duration
	}{{"dial_timeout", o.DialTimeout}, {"ttl", o.TTL}, {"load_report_interval", o.LoadReportInterval}} {
		if d.v <= 0 {
			return o, fmt.Errorf(`%s: option %q must be positive, got %s`, Name, d.key, d.v)
		}
	}
	var err error
	if o.Prefix, err = checkPrefix("prefix", o.Prefix); err != nil {
		return o, err
	}
	if o.ElectionPrefix, err = checkPrefix("election_prefix", o.ElectionPrefix); err != nil {
		return o, err
	}
	if o.SharedPrefix, err = checkPrefix("shared_prefix", o.SharedPrefix); err != nil {
		return o, err
	}
	if overlap(o.ElectionPrefix, o.Prefix) {
		return o, fmt.Errorf(`%s: option "election_prefix" %q and option "prefix" %q overlap: election keys would look like instances`,
			Name, o.ElectionPrefix, o.Prefix)
	}
	if overlap(o.SharedPrefix, o.Prefix) {
		return o, fmt.Errorf(`%s: option "shared_prefix" %q and option "prefix" %q overlap: shared entries would look like instances`,
			Name, o.SharedPrefix, o.Prefix)
	}
	if overlap(o.SharedPrefix, o.ElectionPrefix) {
		return o, fmt.Errorf(`%s: option "shared_prefix" %q and option "election_prefix" %q overlap: shared entries would look like candidates`,
			Name, o.SharedPrefix, o.ElectionPrefix)
	}
	if (o.Username == "") != (o.Password == "") {
		return o, fmt.Errorf(`%s: option "username" and option "password" go together: give both or neither`, Name)
	}
	return o, nil
}

// overlap reports whether the keys under one prefix can be under the other.
func overlap(a, b string) bool { return strings.HasPrefix(a, b) || strings.HasPrefix(b, a) }

// checkPrefix refuses an empty prefix and ends a prefix with "/", so that
// service "a" never reads the keys of service "ab".
func checkPrefix(key, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf(`%s: option %q is empty; leave it out for the default`, Name, key)
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p, nil
}

// clientConfig is the etcd client's configuration for o (checked).
func (o Options) clientConfig() (clientv3.Config, error) {
	cfg := clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout.D(),
		Username:    o.Username,
		Password:    o.Password,
		// The client's own logs (keepalive queue warnings, retries) are
		// noise to a kernrpc user; what matters is logged through slog.
		Logger: zap.NewNop(),
		// Keepalive pings find a dead connection even when no request is
		// waiting on it; 10s is the least interval gRPC allows.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: o.DialTimeout.D(),
	}
	if o.TLS != nil {
		tc, err := o.TLS.config()
		if err != nil {
			return cfg, err
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

func (t *TLSOptions) config() (*tls.Config, error) {
	tc := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf(`%s: option "tls": ca_file: %w`, Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf(`%s: option "tls": ca_file %s holds no PEM certificate`, Name, t.CAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf(`%s: option "tls": cert_file %s and key_file %s: %w`, Name, t.CertFile, t.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New(Name + `: option "tls": cert_file and key_file go together: give both or neither`)
	}
	return tc, nil
}
