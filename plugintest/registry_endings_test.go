package plugintest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registryEndingCases are broken registries that get an ending wrong:
// Close, a stop, a call after Close, a watch's end. Each makes a mistake
// a registry over a remote store makes (a session revoke that fails at
// Close, a cache served after Close, a goroutine bound to the client's
// life instead of the watch's), and each went uncaught by any other
// case, so that the complaint it trips had never been shown to fire.
func registryEndingCases(t *testing.T) []registryBrokenCase {
	broken := registryBroken
	ended := func(wrap func(r registryEnding) kernel.Registry) kernel.Factory[kernel.Registry] {
		return registryBroken(func(r *memory.Registry) kernel.Registry { return wrap(newRegistryEnding(r)) })
	}
	return []registryBrokenCase{
		{
			name: "CloseReportsAnError",
			f:    broken(func(r *memory.Registry) kernel.Registry { return registryCloseErr{r} }),
			caught: []string{"Registry/Close/Deregisters", "Registry/Notify/CloseEnds",
				"Registry/SharedStore/CloseRemoves", "Registry/Leaks"},
			says: [][2]string{
				{"Registry/Close/Deregisters", "Close: broken: revoke session"},
				{"Registry/Leaks", "Close: broken: revoke session"},
			},
		},
		{
			name:   "NotifyWithoutTheCurrentSet",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryNotifyNoCurrent{r} }),
			caught: []string{"Registry/Notify/CurrentSet"},
			says:   [][2]string{{"Registry/Notify/CurrentSet", "want the current set"}},
		},
		{
			name:   "NotifyWithoutAStop",
			f:      broken(func(r *memory.Registry) kernel.Registry { return registryNotifyNilStop{r} }),
			caught: []string{"Registry/Notify/CurrentSet"},
			says:   [][2]string{{"Registry/Notify/CurrentSet", "returned a nil stop"}},
		},
		{
			name:   "NotifyGoroutineOutlivesStop",
			f:      ended(func(r registryEnding) kernel.Registry { return registryNotifyLeak{r} }),
			caught: []string{"Registry/Notify/StopEnds"},
			says:   [][2]string{{"Registry/Notify/StopEnds", "goroutines Notify started still run"}},
		},
		{
			name:   "NotifyAfterCloseServesItsCache",
			f:      ended(func(r registryEnding) kernel.Registry { return registryNotifyCached{r} }),
			caught: []string{"Registry/Notify/CloseEnds"},
			says: [][2]string{
				{"Registry/Notify/CloseEnds", "Notify after Close: nil error"},
				{"Registry/Notify/CloseEnds", "Notify after Close called fn"},
			},
		},
		{
			name: "NotifyOutlivesClose",
			f: registryShadowed(t, func(r, shadow *memory.Registry) kernel.Registry {
				return registryNotifyShadow{r, shadow}
			}),
			caught: []string{"Registry/Notify/CloseEnds"},
			says:   [][2]string{{"Registry/Notify/CloseEnds", "after its registry was closed; want none"}},
		},
		{
			name:   "ResolvePanicsAfterClose",
			f:      ended(func(r registryEnding) kernel.Registry { return registryPanicsAfterClose{r} }),
			caught: []string{"Registry/Leaks"},
			says:   [][2]string{{"Registry/Leaks", "Resolve after Close panicked"}},
		},
		{
			name:   "RegisterHangsAfterClose",
			f:      ended(func(r registryEnding) kernel.Registry { return registryHangsAfterClose{r} }),
			caught: []string{"Registry/Leaks"},
			says:   [][2]string{{"Registry/Leaks", "Register after Close did not return"}},
		},
		{
			name:   "DeleteSharedOfAMissingKeyFails",
			f:      broken(func(r *memory.Registry) kernel.Registry { return &registryStrictDelete{Registry: r} }),
			caught: []string{"Registry/SharedStore/Changes"},
			says:   [][2]string{{"Registry/SharedStore/Changes", "DeleteShared of a key nobody put"}},
		},
		{
			name:   "WatchSharedGoroutineOutlivesItsCtx",
			f:      ended(func(r registryEnding) kernel.Registry { return registryWatchSharedLeak{r} }),
			caught: []string{"Registry/SharedStore/WatchEnds"},
			says:   [][2]string{{"Registry/SharedStore/WatchEnds", "goroutines WatchShared started still run"}},
		},
	}
}

// registryShadowed builds registries whose wrap reaches a second memory
// registry of the same namespace, which Close does not close: what goes
// through it outlives the registry. The shadows close when t ends.
func registryShadowed(t *testing.T, wrap func(r, shadow *memory.Registry) kernel.Registry) kernel.Factory[kernel.Registry] {
	var mu sync.Mutex
	var shadows []*memory.Registry
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range shadows {
			s.Close()
		}
	})
	return kernel.NewFactory("broken-memory", "a memory registry with a shadow its Close forgets", memory.DefaultOptions,
		func(o *memory.Options) (kernel.Registry, error) {
			r, err := memory.New(*o)
			if err != nil {
				return nil, err
			}
			shadow, err := memory.New(*o)
			if err != nil {
				r.Close()
				return nil, err
			}
			mu.Lock()
			shadows = append(shadows, shadow)
			mu.Unlock()
			return wrap(r, shadow), nil
		})
}

// registryEnding is a memory registry that knows whether Close was
// called, for defects that show after it, or that a goroutine bound to
// the registry's life shows.
type registryEnding struct {
	*memory.Registry
	once   *sync.Once
	closed chan struct{}
}

func newRegistryEnding(r *memory.Registry) registryEnding {
	return registryEnding{Registry: r, once: new(sync.Once), closed: make(chan struct{})}
}

func (r registryEnding) Close() error {
	r.once.Do(func() { close(r.closed) })
	return r.Registry.Close()
}

func (r registryEnding) over() bool {
	select {
	case <-r.closed:
		return true
	default:
		return false
	}
}

type registryCloseErr struct{ *memory.Registry }

func (r registryCloseErr) Close() error {
	return errors.Join(r.Registry.Close(), errors.New("broken: revoke session: context deadline exceeded"))
}

// registryNotifyNoCurrent gives the current set only to fn, never as
// Notify's result.
type registryNotifyNoCurrent struct{ *memory.Registry }

func (r registryNotifyNoCurrent) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	_, stop, err := r.Registry.Notify(ctx, service, fn)
	return nil, stop, err
}

// registryNotifyNilStop leaves the notification to end with Close.
type registryNotifyNilStop struct{ *memory.Registry }

func (r registryNotifyNilStop) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	current, _, err := r.Registry.Notify(ctx, service, fn)
	return current, nil, err
}

// registryNotifyLeak starts, with each Notify, a goroutine that ends
// with the registry rather than with stop.
type registryNotifyLeak struct{ registryEnding }

func (r registryNotifyLeak) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	go func() { <-r.closed }()
	return r.Registry.Notify(ctx, service, fn)
}

// registryNotifyCached serves a Notify after Close from what it last
// knew: nothing, given to fn at once.
type registryNotifyCached struct{ registryEnding }

func (r registryNotifyCached) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	if r.over() {
		fn(nil)
		return nil, func() {}, nil
	}
	return r.Registry.Notify(ctx, service, fn)
}

// registryNotifyShadow notifies through a shadow its Close leaves open.
type registryNotifyShadow struct {
	*memory.Registry
	shadow *memory.Registry
}

func (r registryNotifyShadow) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	return r.shadow.Notify(ctx, service, fn)
}

// registryPanicsAfterClose resolves through a client Close set to nil.
type registryPanicsAfterClose struct{ registryEnding }

func (r registryPanicsAfterClose) Resolve(ctx context.Context, service string) ([]kernel.Instance, error) {
	client := r.Registry
	if r.over() {
		client = nil
	}
	return client.Resolve(ctx, service)
}

// registryHangsAfterClose registers through a session Close revoked, and
// waits for a new one that never comes.
type registryHangsAfterClose struct{ registryEnding }

func (r registryHangsAfterClose) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if r.over() {
		<-ctx.Done()
		return ctx.Err()
	}
	return r.Registry.Register(ctx, inst, ttl)
}

// registryStrictDelete refuses to delete a key it did not put.
type registryStrictDelete struct {
	*memory.Registry
	mu  sync.Mutex
	put map[string]bool
}

func (r *registryStrictDelete) PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	r.mu.Lock()
	if r.put == nil {
		r.put = make(map[string]bool)
	}
	r.put[key] = true
	r.mu.Unlock()
	return r.Registry.PutShared(ctx, key, value, ttl)
}

func (r *registryStrictDelete) DeleteShared(ctx context.Context, key string) error {
	r.mu.Lock()
	known := r.put[key]
	r.mu.Unlock()
	if !known {
		return errors.New("broken: delete " + key + ": key not found")
	}
	return r.Registry.DeleteShared(ctx, key)
}

// registryWatchSharedLeak starts, with each WatchShared, a goroutine that
// ends with the registry rather than with the watch's ctx.
type registryWatchSharedLeak struct{ registryEnding }

func (r registryWatchSharedLeak) WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error {
	go func() { <-r.closed }()
	return r.Registry.WatchShared(ctx, prefix, fn)
}
