package kernel

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
)

// Side says which end of a call a filter runs on.
type Side uint8

const (
	ClientSide Side = 1
	ServerSide Side = 2
)

func (s Side) String() string {
	switch s {
	case ClientSide:
		return "client"
	case ServerSide:
		return "server"
	}
	return "unknown"
}

// CallInfo describes one call to the filters it passes through. Filters may
// read every field and may add to the two metadata maps.
type CallInfo struct {
	Method string
	Side   Side
	// Peer is the remote address: on the client, known once the balancer
	// has picked (after next returns); on the server, from the start.
	Peer string
	// Codec is the codec's name the call is encoded with.
	Codec string
	// Metadata travels with the request: on the client a filter may add to
	// it before calling next; on the server it is what the client sent.
	Metadata Metadata
	// ResponseMetadata travels with the response: on the server a filter or
	// handler may set it (see SetResponseMetadata); on the client it holds
	// what the server sent once next returns.
	ResponseMetadata Metadata
	// Instance is, on the client, the instance the balancer picked.
	Instance *Instance

	reply  any        // client: where the response is decoded
	client *callState // client: the call this info belongs to
	server *callCtx   // server: the call this info belongs to
}

// SetRequestMetadata sets one request metadata entry, allocating the map on
// first use.
func (ci *CallInfo) SetRequestMetadata(k, v string) {
	if ci.Metadata == nil {
		ci.Metadata = make(Metadata, 2)
	}
	ci.Metadata[k] = v
}

// SetResponseMetadata sets one response metadata entry.
func (ci *CallInfo) SetResponseMetadata(k, v string) {
	if ci.ResponseMetadata == nil {
		ci.ResponseMetadata = make(Metadata, 2)
	}
	ci.ResponseMetadata[k] = v
}

// Invoker is what a filter calls to pass the call on: the next filter, or at
// the end of the chain the transport (client) or the handler (server).
type Invoker func(ctx context.Context, info *CallInfo, req any) (resp any, err error)

// Filter is middleware around a call. It may inspect or change the request,
// metadata and response, call next at most once (a retry or hedge filter is
// the documented exception), or reject the call by returning a *Status
// without calling next.
type Filter interface {
	Invoke(ctx context.Context, info *CallInfo, req any, next Invoker) (resp any, err error)
}

// FilterFunc adapts a function to Filter.
type FilterFunc func(ctx context.Context, info *CallInfo, req any, next Invoker) (any, error)

// Invoke calls f.
func (f FilterFunc) Invoke(ctx context.Context, info *CallInfo, req any, next Invoker) (any, error) {
	return f(ctx, info, req, next)
}

// configuredFilter is a filter with the scope its config gave it.
type configuredFilter struct {
	filter  Filter
	methods []string // empty: every method
}

func (cf *configuredFilter) applies(method string) bool {
	if len(cf.methods) == 0 {
		return true
	}
	for _, m := range cf.methods {
		if m == method || (strings.HasSuffix(m, "*") && strings.HasPrefix(method, m[:len(m)-1])) {
			return true
		}
	}
	return false
}

// chain builds the invoker that runs filters in order around last.
func chain(filters []Filter, last Invoker) Invoker {
	next := last
	for i := len(filters) - 1; i >= 0; i-- {
		f, n := filters[i], next
		next = func(ctx context.Context, info *CallInfo, req any) (any, error) {
			return f.Invoke(ctx, info, req, n)
		}
	}
	return next
}

// filterChains keeps one prebuilt chain per method, so a call pays nothing
// to find which filters apply to it.
type filterChains struct {
	filters []configuredFilter
	last    Invoker
	all     Invoker  // the chain with every filter, used when none is scoped
	scoped  bool     // some filter applies to some methods only
	byMeth  sync.Map // method -> Invoker, when scoped
	cached  atomic.Int32
}

// maxCachedChains bounds the per-method cache: method names can come from a
// peer, and a peer must not be able to grow our memory.
const maxCachedChains = 1024

func newFilterChains(filters []configuredFilter, last Invoker) *filterChains {
	fc := &filterChains{filters: filters, last: last}
	all := make([]Filter, 0, len(filters))
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
func (fc *filterChains) forMethod(method string) Invoker {
	if !fc.scoped {
		return fc.all
	}
	if inv, ok := fc.byMeth.Load(method); ok {
		return inv.(Invoker)
	}
	var fs []Filter
	for i := range fc.filters {
		if fc.filters[i].applies(method) {
			fs = append(fs, fc.filters[i].filter)
		}
	}
	inv := chain(fs, fc.last)
	if fc.cached.Add(1) <= maxCachedChains {
		fc.byMeth.Store(method, inv)
	}
	return inv
}
