// Package timeout is a filter that gives a call a deadline when its
// caller set none: a default for every method, and one per method. A call
// that already has a deadline keeps it, shorter or longer.
//
// Config name: "timeout". Options, with defaults:
//
//	filters:
//	  - name: timeout
//	    options:
//	      default: 10s        # the deadline of a call that has none; 0: none
//	      methods:            # per method, overriding default; 0: none for that method
//	        Report.Build: 2m  # an exact method name...
//	        "Cache.*": 50ms   # ...or a prefix ending in *; the longest matching prefix wins
//
// On the client the filter runs in the call stage, before the pick, so its
// deadline covers every attempt of the call (put it before a retry filter)
// and reaches the server with the request. The client's own client.timeout
// gives every call a deadline before the filters run, so with it set this
// filter never applies on the client. On the server it bounds the handler
// when the client sent no deadline.
//
// A call that runs out of the filter's deadline fails with
// DeadlineExceeded saying so:
//
//	kernrpc: DeadlineExceeded: timeout: Echo.Slow ran past the deadline of 50ms the timeout filter gave it (the caller set none): ...
//
// Cost: a call that has a deadline, or whose method has none here, costs
// a map lookup (5 ns, no allocation). One the filter gives a deadline
// costs what context.WithTimeout costs, as client.timeout does: about
// 1 µs and 5 allocations on a 2-core VM, and 1.6 µs and 6 on the server,
// whose call context is not one the context package knows, so that it
// watches it from a goroutine. That is the floor of any context with a
// deadline of its own (BenchmarkInvoke's context.WithTimeout-alone: the
// context, its channel, its timer): the filter adds nothing to it. Only a
// pooled context could be free, and a context may outlive its call (a
// goroutine a handler or filter started keeps it), so that a pooled one
// would later report another call's deadline; the engine pools none.
package timeout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "timeout"

// Options configure the filter.
type Options struct {
	// Default is the deadline of a call that has none; 0 gives none.
	Default kernel.Duration `json:"default"`
	// Methods overrides Default per method: by exact name, or by a prefix
	// ending in "*" ("Cache.*"). 0 gives that method no deadline.
	Methods map[string]kernel.Duration `json:"methods"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Default: kernel.Duration(10 * time.Second), Methods: map[string]kernel.Duration{}}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "gives calls without a deadline a default one, per method", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	if o.Default < 0 {
		return nil, fmt.Errorf("option \"default\": must not be negative, got %s", o.Default)
	}
	f := &Filter{def: o.Default.D(), exact: map[string]time.Duration{}}
	for m, d := range o.Methods {
		if d < 0 {
			return nil, fmt.Errorf("option \"methods\": %q: must not be negative, got %s", m, d)
		}
		if strings.TrimSpace(m) == "" || m == "*" {
			return nil, fmt.Errorf("option \"methods\": %q names no method; set default for every method", m)
		}
		if prefix, ok := strings.CutSuffix(m, "*"); ok {
			f.prefixes = append(f.prefixes, prefixTimeout{prefix, d.D()})
		} else {
			f.exact[m] = d.D()
		}
	}
	// Longest prefix first, so that the first match is the most specific.
	sort.Slice(f.prefixes, func(i, j int) bool { return len(f.prefixes[i].prefix) > len(f.prefixes[j].prefix) })
	return f, nil
}

// Filter is the timeout filter.
type Filter struct {
	def      time.Duration
	exact    map[string]time.Duration
	prefixes []prefixTimeout // longest first
}

type prefixTimeout struct {
	prefix string
	d      time.Duration
}

var _ kernel.Filter = (*Filter)(nil)

// For returns the deadline the filter gives a call of method that has
// none; 0 means none.
func (f *Filter) For(method string) time.Duration {
	if d, ok := f.exact[method]; ok {
		return d
	}
	for _, p := range f.prefixes {
		if strings.HasPrefix(method, p.prefix) {
			return p.d
		}
	}
	return f.def
}

// Invoke gives the call its method's deadline if it has none.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if _, ok := ctx.Deadline(); ok {
		return next(ctx, info, req)
	}
	d := f.For(info.Method)
	if d <= 0 {
		return next(ctx, info, req)
	}
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := next(tctx, info, req)
	// By the clock, not tctx.Err(): the server's copy of the deadline can
	// answer before tctx's timer has run, though the deadline has passed.
	if err != nil && ctx.Err() == nil && kernel.CodeOf(err) == kernel.DeadlineExceeded && (errors.Is(tctx.Err(), context.DeadlineExceeded) || past(tctx)) {
		return nil, &kernel.Status{Code: kernel.DeadlineExceeded, Message: "timeout: " + info.Method + " ran past the deadline of " +
			d.String() + " the timeout filter gave it (the caller set none): " + kernel.StatusOf(err).Message}
	}
	return resp, err
}

// past reports whether ctx's deadline has passed, whether or not its timer
// has run yet.
func past(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
