package plugintest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registryNotifyBuffer hands every Notify's fn its sets in one slice it
// reuses, overwriting the set given before: the client has given that
// one to its balancer, which keeps it, and a pick in flight points into
// it.
type registryNotifyBuffer struct {
	*memory.Registry
	mu  sync.Mutex
	buf []kernel.Instance
}

func (r *registryNotifyBuffer) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	return r.Registry.Notify(ctx, service, func(set []kernel.Instance) {
		r.mu.Lock()
		r.buf = append(r.buf[:0], set...)
		buf := r.buf
		r.mu.Unlock()
		fn(buf)
	})
}

// TestRegistryChecksNotifyKeptSets: a Notifier that writes into a set it
// gave fn earlier passes every other check, Notify/Changes included, and
// is caught by Notify/KeptSets, as Watch/KeptSets catches a watch that
// does so.
func TestRegistryChecksNotifyKeptSets(t *testing.T) {
	t.Parallel()
	f := registryBroken(func(r *memory.Registry) kernel.Registry { return &registryNotifyBuffer{Registry: r} })
	rec := registryRecord(t, t.Name(), f, 500*time.Millisecond)
	expectCaught(t, rec, "Registry/Notify/KeptSets")
	expectMessage(t, rec, "Registry/Notify/KeptSets", "must not write into slices or maps it has handed out")
	onlyUnder(t, rec, "Registry/Notify/KeptSets")
}
