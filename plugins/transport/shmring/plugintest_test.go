//go:build linux

package shmring_test

import (
	"path/filepath"
	"testing"

	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Transport(t, shmring.Factory, plugintest.TransportConfig{
		Address: func(dir string) string { return filepath.Join(dir, "s.sock") },
	})
}

// Small rings: frames up to the maximum are chunked through a ring a
// sixteenth of their size.
func TestConformanceWithSmallRings(t *testing.T) {
	plugintest.Transport(t, shmring.Factory, plugintest.TransportConfig{
		Options:      map[string]any{"ring_size": "64KiB", "max_frame_size": "1MiB"},
		Address:      func(dir string) string { return "shm-ring://" + filepath.Join(dir, "s.sock") },
		MaxFrameSize: 1 << 20,
	})
}
