package tcplv

import (
	"testing"

	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Transport(t, Factory, plugintest.TransportConfig{})
}

// A small configured maximum must be what the transport enforces: the
// suite sends frames of exactly that size and one byte over it.
func TestConformanceWithASmallMaxFrameSize(t *testing.T) {
	plugintest.Transport(t, Factory, plugintest.TransportConfig{
		Options:      map[string]any{"max_frame_size": "64KiB"},
		MaxFrameSize: 64 << 10,
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
