//go:build linux

package shmring_test

import (
	"path/filepath"
	"testing"

	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
	"github.com/kernrpc/kernrpc/plugintest"
)

// shmLargeFrame is the frame length from which a ring of ringSize bytes
// carries a frame in chunks: its record (16 bytes, then the frame with
// its 4-byte prefix, rounded up to 8) is over a quarter of the ring.
func shmLargeFrame(ringSize int) int { return ringSize/4 - 20 + 1 }

func TestConformance(t *testing.T) {
	plugintest.Transport(t, shmring.Factory, plugintest.TransportConfig{
		Address:    func(dir string) string { return filepath.Join(dir, "s.sock") },
		LargeFrame: shmLargeFrame(4 << 20),
	})
}

// Small rings: frames up to the maximum are chunked through a ring a
// sixteenth of their size.
func TestConformanceWithSmallRings(t *testing.T) {
	plugintest.Transport(t, shmring.Factory, plugintest.TransportConfig{
		Options:      map[string]any{"ring_size": "64KiB", "max_frame_size": "1MiB"},
		Address:      func(dir string) string { return "shm-ring://" + filepath.Join(dir, "s.sock") },
		MaxFrameSize: 1 << 20,
		LargeFrame:   shmLargeFrame(64 << 10),
	})
}
