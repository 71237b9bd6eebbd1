package faulty_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/kernrpc/kernrpc/plugins/transport/faulty"
	_ "github.com/kernrpc/kernrpc/plugins/transport/shmring"
	"github.com/kernrpc/kernrpc/plugintest"
)

// Over shm-ring, Buffer lends ring space: the wrapper must pass every
// loan back whole, and claim no FrameQueuer it cannot honour.
func TestConformanceWrappingShmRing(t *testing.T) {
	plugintest.Transport(t, faulty.Factory, plugintest.TransportConfig{
		Options: map[string]any{
			"transport":   map[string]any{"name": "shm-ring", "options": map[string]any{"ring_size": "64KiB", "max_frame_size": "1MiB"}},
			"reset_after": math.MaxInt,
		},
		Address:      func(dir string) string { return filepath.Join(dir, "s.sock") },
		MaxFrameSize: 1 << 20,
		LargeFrame:   64<<10/4 - 20 + 1,
	})
}
