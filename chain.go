package kernrpc

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// configuredFilter is a filter with the scope its config gave it.
type configuredFilter struct {
	filter  kernel.Filter
	name    string   // its config name, for messages
	methods []string // empty: every method
}

func (cf *configuredFilter) applies(method string) bool {
	if len(cf.methods) == 0 {
		return true
	}
	for _, m := range cf.methods {
		if kernel.MatchMethod(m, method) {
			return true
		}
	}
	return false
}

// unmatchedPattern is a filter's method pattern that matches no method.
type unmatchedPattern struct{ filter, pattern string }

// unmatched lists the method patterns of filters that match none of
// methods: a misspelt method name leaves its filter applied to nothing,
// with no error anywhere, so the server says so at Start.
func unmatched(filters []configuredFilter, methods []string) []unmatchedPattern {
	var out []unmatchedPattern
	for _, cf := range filters {
		for _, p := range cf.methods {
			if !slices.ContainsFunc(methods, func(m string) bool { return kernel.MatchMethod(p, m) }) {
				out = append(out, unmatchedPattern{cf.name, p})
			}
		}
	}
	return out
}

// chain builds the invoker that runs filters in order around last.
func chain(filters []kernel.Filter, last kernel.Invoker) kernel.Invoker {
	next := last
	for i := len(filters) - 1; i >= 0; i-- {
		f, n := filters[i], next
		next = func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
			return f.Invoke(ctx, info, req, n)
		}
	}
	return next
}

// chainFor builds the chain of the filters that apply to method.
func chainFor(filters []configuredFilter, method string, last kernel.Invoker) kernel.Invoker {
	var fs []kernel.Filter
	for i := range filters {
		if filters[i].applies(method) {
			fs = append(fs, filters[i].filter)
		}
	}
	return chain(fs, last)
}

// filtersAs lists the filters that apply to method and implement T (an
// optional interface: Admitter, CallObserver, ContextValuer), in config
// order.
func filtersAs[T any](filters []configuredFilter, method string) []T {
	var out []T
	for i := range filters {
		if a, ok := filters[i].filter.(T); ok && filters[i].applies(method) {
			out = append(out, a)
		}
	}
	return out
}

// deadliners lists the filters that give calls without a deadline one
// (kernel.Deadliner), in the order given.
func deadliners(filters []configuredFilter) []configuredFilter {
	var out []configuredFilter
	for _, cf := range filters {
		if _, ok := cf.filter.(kernel.Deadliner); ok {
			out = append(out, cf)
		}
	}
	return out
}

// timeoutFrom is the deadline the first of ds that applies to the call
// and gives one gives it, with that filter's name.
func timeoutFrom(ds []configuredFilter, info *kernel.CallInfo) (time.Duration, string) {
	for i := range ds {
		if !ds[i].applies(info.Method) {
			continue
		}
		if t := ds[i].filter.(kernel.Deadliner).CallTimeout(info); t > 0 {
			return t, ds[i].name
		}
	}
	return 0, ""
}

// filterChains keeps one prebuilt chain per method, so a call pays nothing
// to find which filters apply to it.
type filterChains struct {
	filters []configuredFilter
	last    kernel.Invoker
	all     kernel.Invoker // the chain with every filter, used when none is scoped
	scoped  bool           // some filter applies to some methods only
	byMeth  sync.Map       // method -> Invoker, when scoped
	cached  atomic.Int32
}

// maxCachedChains bounds the per-method cache: method names can come from a
// peer, and a peer must not be able to grow our memory.
const maxCachedChains = 1024

func newFilterChains(filters []configuredFilter, last kernel.Invoker) *filterChains {
	fc := &filterChains{filters: filters, last: last}
	all := make([]kernel.Filter, 0, len(filters))
	for _, f := range filters {
		all = append(all, f.filter)
		if len(f.methods) > 0 {
			fc.scoped = true
		}
	}
	fc.all = chain(all, last)
	return fc
}

// forMethod returns the chain for method, built once per method.
func (fc *filterChains) forMethod(method string) kernel.Invoker {
	if !fc.scoped {
		return fc.all
	}
	if inv, ok := fc.byMeth.Load(method); ok {
		return inv.(kernel.Invoker)
	}
	inv := chainFor(fc.filters, method, fc.last)
	if fc.cached.Add(1) <= maxCachedChains {
		fc.byMeth.Store(method, inv)
	}
	return inv
}

// streamChain builds the stream invoker that runs filters in order around
// last.
func streamChain(filters []kernel.StreamFilter, last kernel.StreamInvoker) kernel.StreamInvoker {
	next := last
	for i := len(filters) - 1; i >= 0; i-- {
		f, n := filters[i], next
		next = func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream) error {
			return f.InvokeStream(ctx, info, st, n)
		}
	}
	return next
}
