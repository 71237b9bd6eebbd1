package tcplv

import (
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Transport(t, Factory, plugintest.TransportConfig{})
}

// A small configured maximum must be what the transport enforces: the
// suite sends frames of exactly that size and one byte over it. Keepalive
// is fast here, so that the Idle checks outlast an interval and a timeout:
// an idle connection, and one waiting for a slow answer (Pings sent and
// answered), must both live on.
func TestConformanceWithASmallMaxFrameSizeAndFastKeepalive(t *testing.T) {
	plugintest.Transport(t, Factory, plugintest.TransportConfig{
		Options: map[string]any{
			"max_frame_size":     "64KiB",
			"keepalive_interval": "100ms",
			"keepalive_timeout":  "250ms",
		},
		MaxFrameSize: 64 << 10,
		Idle:         500 * time.Millisecond,
	})
}

// TLS takes other paths: handshakes on goroutines of their own, Accept
// taking finished ones from a channel, reads through TLS records.
func TestConformanceWithTLS(t *testing.T) {
	pki := newTestPKI(t)
	plugintest.Transport(t, Factory, plugintest.TransportConfig{
		Options: map[string]any{"tls": map[string]any{
			"cert_file": pki.serverCert,
			"key_file":  pki.serverKey,
			"ca_file":   pki.caFile,
		}},
	})
}
