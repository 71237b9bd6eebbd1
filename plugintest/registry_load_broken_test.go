package plugintest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// TestRegistryCatchesLoadMetadataAndCloseDefects: memory registries with
// one defect each in what the suite long let through: load reports
// (kernel.LoadReporter), metadata that is not UTF-8, and a Close during
// a registry's first Resolve and Watch. Each passed the suite before the
// check that catches it was added.
func TestRegistryCatchesLoadMetadataAndCloseDefects(t *testing.T) {
	t.Parallel()
	broken := registryBroken
	registryCatches(t, []registryBrokenCase{
		{
			// A ReportLoad that accepts every report and publishes none.
			name:   "ReportLoadPublishesNothing",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryLoadIgnored{r} }),
			caught: []string{"Registry/Load/Resolve", "Registry/Load/Watch"},
			says:   [][2]string{{"Registry/Load/Resolve", "after a's load was reported"}},
		},
		{
			// A watch that passes a set on only when an instance came,
			// went or changed its address or metadata: a load change is
			// lost on its way to the balancers.
			name:   "WatchMissesLoadChanges",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryRelay{r, registryLoadBlind} }),
			caught: []string{"Registry/Load/Watch"},
			says:   [][2]string{{"Registry/Load/Watch", "a reported load is a change of the set"}},
		},
		{
			// Reports closer than a second apart are dropped rather than
			// held: the first of a burst stays, the latest is lost.
			name:   "ReportLoadKeepsTheFirstOfABurst",
			f:      broken(func(r *memory.Registry) kernel.Registry { return &registryLoadFirstWins{Registry: r} }),
			caught: []string{"Registry/Load/Resolve"},
			says:   [][2]string{{"Registry/Load/Resolve", "reported again at once"}},
		},
		{
			// A report for an instance not registered registers it, as
			// an upsert of the instance's record would.
			name:   "ReportLoadRegisters",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryLoadUpserts{r} }),
			caught: []string{"Registry/Load/NotRegistered"},
			says: [][2]string{
				{"Registry/Load/NotRegistered", "ReportLoad of an instance nobody registered: nil error"},
				{"Registry/Load/NotRegistered", "a load report must not register an instance"},
			},
		},
		{
			// Metadata stored as JSON text: bytes that are not UTF-8
			// come back as U+FFFD.
			name: "MetadataMangledIntoUTF8",
			f: broken(func(r *memory.Registry) kernel.Registry {
				return registryMetadataCodec{r, func(md map[string]string) map[string]string {
					out := make(map[string]string, len(md))
					for k, v := range md {
						out[strings.ToValidUTF8(k, "\uFFFD")] = strings.ToValidUTF8(v, "\uFFFD")
					}
					return out
				}}
			}),
			caught: []string{"Registry/Metadata/NotUTF8"},
			says:   [][2]string{{"Registry/Metadata/NotUTF8", "never mangle it"}},
		},
		{
			// Register reports the metadata refused, but the instance
			// was written before the check.
			name:   "MetadataRefusedAfterRegistering",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryRefusesLate{r} }),
			caught: []string{"Registry/Metadata/NotUTF8"},
			says:   [][2]string{{"Registry/Metadata/NotUTF8", "a refused Register must register nothing"}},
		},
		{
			// The first Resolve or Watch of a service waits for its first
			// answer, which Close stops without waking who waits.
			name:   "CloseLeavesTheFirstResolveWaiting",
			f:      broken(func(r *memory.Registry) kernel.Registry { return newRegistryFirstAnswer(r) }),
			caught: []string{"Registry/Close/DuringFirstUse"},
			says:   [][2]string{{"Registry/Close/DuringFirstUse", "Close must end the calls"}},
		},
	})
}

type registryLoadIgnored struct{ *memory.Registry }

func (registryLoadIgnored) ReportLoad(context.Context, kernel.Instance, kernel.Load) error {
	return nil
}

// registryLoadBlind, a relay, sends a set only when it differs from the
// last one sent other than by a Load.
func registryLoadBlind(ctx context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance) {
	var last []kernel.Instance
	sent := false
	for set := range in {
		if sent && registrySame(set, last) {
			continue
		}
		last, sent = set, true
		select {
		case out <- set:
		case <-ctx.Done():
			return
		}
	}
}

// registryLoadFirstWins drops a report that comes within a second of the
// last one it passed on for the same instance.
type registryLoadFirstWins struct {
	*memory.Registry
	mu   sync.Mutex
	last map[string]time.Time
}

func (r *registryLoadFirstWins) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	key := inst.Service + "/" + inst.ID
	r.mu.Lock()
	if time.Since(r.last[key]) < time.Second {
		r.mu.Unlock()
		return nil
	}
	if r.last == nil {
		r.last = make(map[string]time.Time)
	}
	r.last[key] = time.Now()
	r.mu.Unlock()
	return r.Registry.ReportLoad(ctx, inst, load)
}

// registryLoadUpserts registers an instance whose load is reported if it
// is not registered.
type registryLoadUpserts struct{ *memory.Registry }

func (r registryLoadUpserts) ReportLoad(ctx context.Context, inst kernel.Instance, load kernel.Load) error {
	if err := r.Registry.ReportLoad(ctx, inst, load); err == nil {
		return nil
	}
	inst.Load = load
	return r.Registry.Register(ctx, inst, registryLongTTL)
}

// registryRefusesLate registers first and checks the metadata after.
type registryRefusesLate struct{ *memory.Registry }

func (r registryRefusesLate) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if err := r.Registry.Register(ctx, inst, ttl); err != nil {
		return err
	}
	for k, v := range inst.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return kernel.Errorf(kernel.InvalidArgument, "broken: metadata %q is not UTF-8", k)
		}
	}
	return nil
}

// registryFirstAnswer makes the first Resolve or Watch of each service
// wait for a first answer that comes 100ms later, from a loader that
// Close stops without waking who waits: they wait for their ctx.
type registryFirstAnswer struct {
	*memory.Registry
	mu     *sync.Mutex
	ready  map[string]chan struct{}
	once   *sync.Once
	closed chan struct{}
}

func newRegistryFirstAnswer(r *memory.Registry) registryFirstAnswer {
	return registryFirstAnswer{Registry: r, mu: new(sync.Mutex), ready: make(map[string]chan struct{}),
		once: new(sync.Once), closed: make(chan struct{})}
}

func (r registryFirstAnswer) first(ctx context.Context, service string) error {
	r.mu.Lock()
	ready, ok := r.ready[service]
	if !ok {
		ready = make(chan struct{})
		r.ready[service] = ready
		go func() {
			t := time.NewTimer(100 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				close(ready)
			case <-r.closed: // the defect: ready is never closed
			}
		}()
	}
	r.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r registryFirstAnswer) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	if err := r.first(ctx, service); err != nil {
		return nil, err
	}
	return r.Registry.Resolve(ctx, service)
}

func (r registryFirstAnswer) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	if err := r.first(ctx, service); err != nil {
		return nil, err
	}
	return r.Registry.Watch(ctx, service)
}

func (r registryFirstAnswer) Close() error {
	r.once.Do(func() { close(r.closed) })
	return r.Registry.Close()
}
