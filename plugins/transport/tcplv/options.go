package tcplv

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the transport's config name.
const Name = "tcp-lv"

// Factory builds tcp-lv transports from config; init registers it.
var Factory = kernel.NewFactory[kernel.Transport](Name,
	"TCP (optionally TLS) with length-value frames, direct writes with coalescing, pooled buffers and keepalive",
	DefaultOptions, New)

func init() { kernel.RegisterTransport(Factory) }

// Options configure a tcp-lv transport; the package doc lists the defaults.
type Options struct {
	// MaxFrameSize bounds the length field of frames read and written.
	MaxFrameSize kernel.Size `json:"max_frame_size"`
	// KeepaliveInterval is how long a waiting reader hears nothing before a
	// Ping goes out; it is also the OS TCP keepalive interval.
	KeepaliveInterval kernel.Duration `json:"keepalive_interval"`
	// KeepaliveTimeout is how long the peer has to answer that Ping.
	KeepaliveTimeout kernel.Duration `json:"keepalive_timeout"`
	// WriteTimeout is how long a write may wait for the peer to drain its
	// socket before the connection is killed.
	WriteTimeout kernel.Duration `json:"write_timeout"`
	// ReadBufferSize is the size of each connection's read buffer.
	ReadBufferSize kernel.Size `json:"read_buffer_size"`
	// MaxMetadataEntries and MaxMetadataBytes bound the metadata of one
	// frame, read or written.
	MaxMetadataEntries int         `json:"max_metadata_entries"`
	MaxMetadataBytes   kernel.Size `json:"max_metadata_bytes"`
	// FrameTimeout is how long a frame may take to arrive once its first
	// byte has: a peer that trickles, or stops half way, is cut off.
	FrameTimeout kernel.Duration `json:"frame_timeout"`
	// FirstFrameTimeout is how long an accepted connection may stay
	// silent before its first frame.
	FirstFrameTimeout kernel.Duration `json:"first_frame_timeout"`
	// MaxWriteQueue bounds the bytes queued for a peer; one that does not
	// read and lets more pile up is cut off. 0 means 32MiB, or twice
	// MaxFrameSize if that is more.
	MaxWriteQueue kernel.Size `json:"max_write_queue"`
	// MinPingInterval is the shortest gap between a peer's Pings that is
	// not held against it; 0 means half of KeepaliveInterval, at most 1s.
	MinPingInterval kernel.Duration `json:"min_ping_interval"`
	// TLS turns TLS on when not nil.
	TLS *TLSOptions `json:"tls"`
	// Logger receives the reasons connections are closed; nil means
	// slog.Default(). Code only: config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// TLSOptions configure TLS. One set serves both directions: a transport
// that listens uses the server settings, one that dials the client ones.
type TLSOptions struct {
	CertFile           string `json:"cert_file"`
	KeyFile            string `json:"key_file"`
	CAFile             string `json:"ca_file"`
	ClientCAFile       string `json:"client_ca_file"`
	RequireClientCert  bool   `json:"require_client_cert"`
	ServerName         string `json:"server_name"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify"`
}

// defaultReadBufferSize is read_buffer_size's default; read buffers of
// this size are reused across connections (see freeReaders). It is small
// on purpose: a read into the buffer copies what it brings once more, and
// bufio reads a frame's remaining bytes straight into the frame's own
// buffer only when they are at least a buffer long. With 8 KiB, a 64 KiB
// frame is copied an eighth, not whole, and echoing 64 KiB costs 10-15%
// less CPU than with 64 KiB, while a burst of small frames still arrives in
// one read (64 answers of 16 B take under 4 KiB).
const defaultReadBufferSize = 8 << 10

// DefaultOptions returns the options a config without an options block gets.
func DefaultOptions() *Options {
	return &Options{
		MaxFrameSize:      kernel.DefaultMaxFrameSize,
		KeepaliveInterval: kernel.Duration(10 * time.Second),
		KeepaliveTimeout:  kernel.Duration(5 * time.Second),
		WriteTimeout:      kernel.Duration(30 * time.Second),
		ReadBufferSize:    defaultReadBufferSize,

		MaxMetadataEntries: kernel.DefaultMaxMetadataEntries,
		MaxMetadataBytes:   kernel.DefaultMaxMetadataBytes,
		FrameTimeout:       kernel.Duration(10 * time.Second),
		FirstFrameTimeout:  kernel.Duration(10 * time.Second),
	}
}

// defaultWriteQueue is max_write_queue unless set: at least two frames of
// the largest size.
const defaultWriteQueue = 32 << 20

func (o *Options) maxWriteQueue() int {
	if o.MaxWriteQueue > 0 {
		return int(o.MaxWriteQueue)
	}
	return max(defaultWriteQueue, 2*int(o.MaxFrameSize))
}

// minPingInterval is o.MinPingInterval with its default filled in: a peer
// whose own keepalive is as short as ours must not be held to more.
func (o *Options) minPingInterval() time.Duration {
	if o.MinPingInterval > 0 {
		return o.MinPingInterval.D()
	}
	return min(time.Second, o.KeepaliveInterval.D()/2)
}

// minTimeout is the least any of the transport's timeouts and intervals
// may be.
const minTimeout = time.Millisecond

// maxTimeout is the most any of them may be: a hundred years, as good as
// never, and far enough below time.Duration's limit (292 years) that the
// deadlines derived from them (a write's, at 1.5 × write_timeout; a TLS
// handshake's, keepalive_interval + keepalive_timeout; the frame clock's,
// in Unix nanoseconds) cannot overflow into the past.
const maxTimeout = 100 * 365 * 24 * time.Hour

// maxOSKeepalive is the longest OS TCP keepalive idle time and probe
// interval Linux takes (its MAX_TCP_KEEPIDLE and MAX_TCP_KEEPINTVL); above
// it setsockopt fails, net drops the error, and the system's 2 h idle time
// and 75 s probes stay.
const maxOSKeepalive = 32767 * time.Second

// maxLengthField is the largest value the 32-bit length prefix can hold.
const maxLengthField = 1<<32 - 1

func optionError(key, format string, args ...any) error {
	return fmt.Errorf("tcp-lv: option %q: "+format, append([]any{key}, args...)...)
}

func (o *Options) validate() error {
	if o.MaxFrameSize < kernel.FrameFixedLen || o.MaxFrameSize > maxLengthField {
		return optionError("max_frame_size", "must be between %d and %d bytes (the length field is 32 bits), got %d",
			kernel.FrameFixedLen, int64(maxLengthField), o.MaxFrameSize)
	}
	for _, d := range []struct {
		key string
		v   kernel.Duration
	}{
		{"keepalive_interval", o.KeepaliveInterval},
		{"keepalive_timeout", o.KeepaliveTimeout},
		{"write_timeout", o.WriteTimeout},
		{"frame_timeout", o.FrameTimeout},
		{"first_frame_timeout", o.FirstFrameTimeout},
	} {
		if d.v <= 0 {
			return optionError(d.key, "must be positive, got %s", d.v)
		}
		// Below a millisecond, every connection would fail at its first
		// wait, at run time: refuse it here, where the file is named.
		if d.v.D() < minTimeout {
			return optionError(d.key, "must be at least %s, got %s (a unit left off? write 10s, 100ms)", minTimeout, d.v)
		}
		if d.v.D() > maxTimeout {
			return optionError(d.key, "must be at most %s (100 years), got %s", maxTimeout, d.v)
		}
	}
	if o.MinPingInterval < 0 {
		return optionError("min_ping_interval", "must not be negative, got %s (0 means half of keepalive_interval, at most 1s)", o.MinPingInterval)
	}
	if o.MinPingInterval > 0 && o.MinPingInterval.D() < minTimeout {
		return optionError("min_ping_interval", "must be at least %s, got %s (a unit left off? write 1s, 100ms; 0 means half of keepalive_interval, at most 1s)", minTimeout, o.MinPingInterval)
	}
	if o.MaxMetadataEntries < 1 {
		return optionError("max_metadata_entries", "must be at least 1, got %d", o.MaxMetadataEntries)
	}
	if o.MaxMetadataBytes < 1 {
		return optionError("max_metadata_bytes", "must be at least 1 byte, got %d", o.MaxMetadataBytes)
	}
	// Two frames of the largest size must always fit, or a healthy peer
	// receiving large answers would be cut off.
	if o.MaxWriteQueue != 0 && o.MaxWriteQueue < 2*o.MaxFrameSize {
		return optionError("max_write_queue", "must be at least twice max_frame_size (%d), got %d; 0 means the default", 2*o.MaxFrameSize, o.MaxWriteQueue)
	}
	// bufio silently raises smaller sizes to 16.
	if o.ReadBufferSize < 16 {
		return optionError("read_buffer_size", "must be at least 16 bytes, got %d", o.ReadBufferSize)
	}
	return nil
}

// tlsConfigs builds the server and client configurations. server is nil
// when no certificate is configured: such a transport can dial but not
// listen.
func (o *TLSOptions) tlsConfigs() (server, client *tls.Config, err error) {
	if (o.CertFile == "") != (o.KeyFile == "") {
		if o.CertFile == "" {
			return nil, nil, optionError("tls.cert_file", "is required with tls.key_file")
		}
		return nil, nil, optionError("tls.key_file", "is required with tls.cert_file")
	}
	if o.RequireClientCert && o.ClientCAFile == "" {
		return nil, nil, optionError("tls.client_ca_file", "is required when tls.require_client_cert is true")
	}
	client = &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         o.ServerName,
		InsecureSkipVerify: o.InsecureSkipVerify,
	}
	if o.CAFile != "" {
		if client.RootCAs, err = loadCertPool("tls.ca_file", o.CAFile); err != nil {
			return nil, nil, err
		}
	}
	var clientCAs *x509.CertPool
	if o.ClientCAFile != "" {
		if clientCAs, err = loadCertPool("tls.client_ca_file", o.ClientCAFile); err != nil {
			return nil, nil, err
		}
	}
	if o.CertFile == "" {
		return nil, client, nil
	}
	certPEM, err := os.ReadFile(o.CertFile)
	if err != nil {
		return nil, nil, optionError("tls.cert_file", "%w", err)
	}
	keyPEM, err := os.ReadFile(o.KeyFile)
	if err != nil {
		return nil, nil, optionError("tls.key_file", "%w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, optionError("tls.cert_file", "certificate %s with key %s: %w", o.CertFile, o.KeyFile, err)
	}
	client.Certificates = []tls.Certificate{cert}
	server = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if clientCAs != nil {
		server.ClientCAs = clientCAs
		server.ClientAuth = tls.VerifyClientCertIfGiven
		if o.RequireClientCert {
			server.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return server, client, nil
}

func loadCertPool(key, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, optionError(key, "%w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, optionError(key, "no PEM certificate in %s", file)
	}
	return pool, nil
}
