package plugintest

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registryBoundaryCases are memory registries with one defect each that
// shows only past the easy middle (later changes, long or unusual
// metadata, cancellation, Close), and the subtests that must catch them.
// TestRegistryCatchesBrokenPlugins runs them with the others, all at once:
// their runs mostly wait.
func registryBoundaryCases() []registryBrokenCase {
	broken := registryBroken
	return []registryBrokenCase{
		{name: "WatchSendWithoutCtx", f: broken(func(r *memory.Registry) kernel.Registry { return registryRelay{r, registryBlockingSend} }),
			caught: []string{"Registry/Leaks"}},
		{name: "KeeperOutlivesClose", f: broken(func(r *memory.Registry) kernel.Registry { return newRegistryOwnKeeper(r) }),
			caught: []string{"Registry/Leaks"}},
		{name: "WatchDoubleBuffers", f: broken(func(r *memory.Registry) kernel.Registry { return registryRelay{r, registryDoubleBuffer} }),
			caught: []string{"Registry/Watch/KeptSets"}},
		{name: "ResolveReusesItsSlice", f: broken(func(r *memory.Registry) kernel.Registry { return &registryResolveBuffer{Registry: r} }),
			caught: []string{"Registry/Resolve/KeptSet"}},
		{name: "WatchComparesIDsOnly", f: broken(func(r *memory.Registry) kernel.Registry { return registryRelay{r, registryIDsOnly} }),
			caught: []string{"Registry/Watch/Sequence"}},
		{name: "MetadataCutAt255Bytes", f: broken(func(r *memory.Registry) kernel.Registry {
			return registryMetadataCodec{r, func(md map[string]string) map[string]string {
				out := maps.Clone(md)
				for k, v := range out {
					if len(v) > 255 {
						out[k] = v[:255] // a DNS TXT string's limit
					}
				}
				return out
			}}
		}), caught: []string{"Registry/Metadata/Resolve", "Registry/Metadata/Watch"}},
		{name: "MetadataFlattenedToLines", f: broken(func(r *memory.Registry) kernel.Registry {
			return registryMetadataCodec{r, func(md map[string]string) map[string]string {
				// Stored as "key=value" lines, as a backend with one string
				// field per instance might, and parsed back.
				var lines []string
				for k, v := range md {
					lines = append(lines, k+"="+v)
				}
				out := make(map[string]string)
				for _, l := range strings.Split(strings.Join(lines, "\n"), "\n") {
					if k, v, ok := strings.Cut(l, "="); ok {
						out[k] = v
					}
				}
				return out
			}}
		}), caught: []string{"Registry/Metadata/Resolve", "Registry/Metadata/Watch"}},
	}
}

// registryRelay passes the memory registry's watch through relay, which
// runs on a goroutine of its own and closes out when it returns.
type registryRelay struct {
	*memory.Registry
	relay func(ctx context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance)
}

func (r registryRelay) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	in, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	out := make(chan []kernel.Instance)
	go func() {
		defer close(out)
		r.relay(ctx, in, out)
	}()
	return out, nil
}

// registryBlockingSend sends each set without watching ctx: once the
// reader stops reading, with a set on its way, the goroutine waits for
// ever.
func registryBlockingSend(_ context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance) {
	for set := range in {
		out <- set
	}
}

// registryDoubleBuffer copies each set into one of two buffers in turn,
// to spare an allocation per set: the set sent two sets ago is
// overwritten. (Race-free for a reader that reads a set only before
// receiving the next, so that -race does not stop the test before the
// suite sees the defect.)
func registryDoubleBuffer(ctx context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance) {
	bufs := [2][]kernel.Instance{make([]kernel.Instance, 0, 16), make([]kernel.Instance, 0, 16)}
	n := 0
	for set := range in {
		b := append(bufs[n%2][:0], set...)
		bufs[n%2] = b
		n++
		select {
		case out <- b:
		case <-ctx.Done():
			return
		}
	}
}

// registryIDsOnly sends a set only when its instance IDs differ from the
// last set sent: it misses an instance registered again with new metadata
// or a new address.
func registryIDsOnly(ctx context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance) {
	var last []string
	sent := false
	for set := range in {
		ids := make([]string, len(set))
		for i, inst := range set {
			ids[i] = inst.ID
		}
		slices.Sort(ids)
		if sent && slices.Equal(ids, last) {
			continue
		}
		last, sent = ids, true
		select {
		case out <- set:
		case <-ctx.Done():
			return
		}
	}
}

// registryResolveBuffer returns every Resolve's set in one slice it
// reuses, overwriting the set returned before.
type registryResolveBuffer struct {
	*memory.Registry
	mu  sync.Mutex
	buf []kernel.Instance
}

func (r *registryResolveBuffer) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	set, err := r.Registry.Resolve(ctx, service)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf[:0], set...)
	return r.buf, nil
}

// registryOwnKeeper renews each registration on a goroutine of its own,
// which Deregister stops and Close forgets.
type registryOwnKeeper struct {
	*memory.Registry
	mu   sync.Mutex
	stop map[string]chan struct{}
}

func newRegistryOwnKeeper(r *memory.Registry) *registryOwnKeeper {
	return &registryOwnKeeper{Registry: r, stop: make(map[string]chan struct{})}
}

func (r *registryOwnKeeper) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if err := r.Registry.Register(ctx, inst, ttl); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.stop[inst.ID]; ok {
		return nil
	}
	stop := make(chan struct{})
	r.stop[inst.ID] = stop
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				// A heartbeat; the memory registry keeps the lease itself.
			}
		}
	}()
	return nil
}

func (r *registryOwnKeeper) Deregister(ctx context.Context, inst kernel.Instance) error {
	r.mu.Lock()
	if stop, ok := r.stop[inst.ID]; ok {
		close(stop)
		delete(r.stop, inst.ID)
	}
	r.mu.Unlock()
	return r.Registry.Deregister(ctx, inst)
}

// registryMetadataCodec stores each instance's metadata as store makes
// it: a lossy encoding.
type registryMetadataCodec struct {
	*memory.Registry
	store func(map[string]string) map[string]string
}

func (r registryMetadataCodec) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if inst.Metadata != nil {
		inst.Metadata = r.store(inst.Metadata)
	}
	return r.Registry.Register(ctx, inst, ttl)
}
