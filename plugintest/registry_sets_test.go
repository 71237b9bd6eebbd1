package plugintest

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// registrySetCases are broken registries that hand out a set nobody
// registered, or stop a watch before its ctx does. Like the ending cases,
// each trips complaints no other case had been shown to fire.
func registrySetCases() []registryBrokenCase {
	cut := func(sets int) kernel.Factory[kernel.Registry] {
		return registryBroken(func(r *memory.Registry) kernel.Registry { return registryWatchCut{r, sets} })
	}
	return []registryBrokenCase{
		{
			// A watch over a stream that ends, whose end the registry
			// passes on by closing the channel instead of resuming.
			name:   "WatchClosesAtOnce",
			f:      cut(0),
			caught: []string{"Registry/Watch/InitialSet"},
			says:   [][2]string{{"Registry/Watch/InitialSet", "watch channel closed before sending anything"}},
		},
		{
			name:   "WatchClosesAfterTheFirstSet",
			f:      cut(1),
			caught: []string{"Registry/Watch/Additions"},
			says:   [][2]string{{"Registry/Watch/Additions", "watch channel closed while waiting"}},
		},
		{
			// A watch that sends the cache it starts with, empty, before
			// the first answer from the store.
			name:   "WatchStartsWithAnEmptySet",
			f:      registryBroken(func(r *memory.Registry) kernel.Registry { return registryRelay{r, registryEmptyFirst} }),
			caught: []string{"Registry/Watch/InitialSet"},
			says:   [][2]string{{"Registry/Watch/InitialSet", "first watched set = []"}},
		},
		{
			name:   "NotifyListsAPlaceholder",
			f:      registryBroken(func(r *memory.Registry) kernel.Registry { return registryNotifyPlaceholder{r} }),
			caught: []string{"Registry/Notify/CurrentSet"},
			says:   [][2]string{{"Registry/Notify/CurrentSet", "before any Register returned"}},
		},
		{
			// A watch bound to the registry's life, as one on a client's
			// background context is: it outlives its ctx, and so do the
			// calls of its fn.
			name:   "WatchSharedOutlivesItsCtx",
			f:      registryBroken(func(r *memory.Registry) kernel.Registry { return registryWatchSharedDetached{r} }),
			caught: []string{"Registry/SharedStore/WatchEnds"},
			says: [][2]string{
				{"Registry/SharedStore/WatchEnds", "goroutines WatchShared started still run"},
				{"Registry/SharedStore/WatchEnds", "after the watch's ctx was cancelled and its goroutines ended"},
			},
		},
	}
}

// registryWatchCut passes on the first sets of a watch, then closes it.
type registryWatchCut struct {
	*memory.Registry
	sets int
}

func (r registryWatchCut) Watch(ctx context.Context, service string) (<-chan []kernel.Instance, error) {
	wctx, cancel := context.WithCancel(ctx)
	in, err := r.Registry.Watch(wctx, service)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan []kernel.Instance)
	go func() {
		defer close(out)
		defer cancel()
		for range r.sets {
			set, open := <-in
			if !open {
				return
			}
			select {
			case out <- set:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// registryEmptyFirst, a relay, sends an empty set before the watch's own.
func registryEmptyFirst(ctx context.Context, in <-chan []kernel.Instance, out chan<- []kernel.Instance) {
	select {
	case out <- []kernel.Instance{}:
	case <-ctx.Done():
	}
	for set := range in {
		select {
		case out <- set:
		case <-ctx.Done():
		}
	}
}

// registryNotifyPlaceholder lists a placeholder as the current set of a
// service nobody registered, as registryPlaceholder's Resolve does.
type registryNotifyPlaceholder struct{ *memory.Registry }

func (r registryNotifyPlaceholder) Notify(ctx context.Context, service string, fn func([]kernel.Instance)) ([]kernel.Instance, func(), error) {
	current, stop, err := r.Registry.Notify(ctx, service, fn)
	if err == nil && len(current) == 0 {
		current = []kernel.Instance{{Service: service, ID: "placeholder", Address: "127.0.0.1:1"}}
	}
	return current, stop, err
}

// registryWatchSharedDetached watches with a ctx that is never done: the
// watch ends only with the registry.
type registryWatchSharedDetached struct{ *memory.Registry }

func (r registryWatchSharedDetached) WatchShared(ctx context.Context, prefix string, fn func(key string, value []byte)) error {
	return r.Registry.WatchShared(context.WithoutCancel(ctx), prefix, fn)
}
