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
// The filter is a kernel.Deadliner: the engine asks it for the method's
// deadline as the call starts, before any filter runs, wherever it stands
// in the chain, so that the deadline covers every attempt of the call and
// reaches the server with the request. The client's own client.timeout
// comes first, so with it set this filter never applies on the client. On
// the server it bounds the handler when the client sent no deadline.
// Called outside the engine (a chain of your own, plugintest), Invoke
// gives the deadline itself, with context.WithTimeout.
//
// A call that runs out of the filter's deadline fails with
// DeadlineExceeded saying so; on the client:
//
//	kernrpc: DeadlineExceeded: the 50ms deadline the timeout filter gave the call (the caller set none) passed while waiting for the answer to Echo.Slow from 127.0.0.1:7000
//
// and when the server's filter gave it:
//
//	kernrpc: DeadlineExceeded: the 30ms deadline the timeout filter gave the call (the client sent none) passed while the server ran Echo.Slow
//
// Cost: a call that has a deadline, or whose method has none here, costs
// a map lookup (5 ns, no allocation). Giving a call a deadline costs no
// allocation on either side when the caller's context cannot be canceled
// (context.Background, and values on it): the engine keeps the deadline
// in the call's own context instead of a context.WithTimeout, and tcp-lv
// waits for it with a socket deadline (the engine's
// TestGivenDeadlineCostsNoAllocation, BenchmarkDeadline). In time, on a
// 2-core VM: Invoke on a call that already has its deadline costs 6 ns
// (BenchmarkInvoke pass); the engine's own bookkeeping for a deadline it
// gives some 0.1 µs (BenchmarkGivenDeadline); a caller that waits for its
// answer under it is woken by the deadline's timer on its own channel,
// and its first request carries the timeout as given, without another
// clock read. A whole call with a deadline given on the client, against
// one through a pass-through filter (BenchmarkDeadline client-filter
// against client-pass, alternating pairs): +71 ± 61 ns at 64 callers (10
// pairs), +48 ± 214 ns at 1 caller (20 pairs; such a call takes 12 µs,
// and varies by some 0.3 µs between runs). One given on the server costs
// some 0.1 µs, within the benchmark's noise (server-filter
// against server-pass). With a caller's context that can be canceled,
// the engine uses context.WithTimeout: about 0.45 µs and 5 allocations
// (BenchmarkInvoke's context.WithTimeout-alone).
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
		if m == "*" {
			return nil, fmt.Errorf("option \"methods\": %q names no method; set default for every method", m)
		}
		if err := kernel.CheckMethodPattern(m); err != nil {
			return nil, fmt.Errorf("option \"methods\": %q %v", m, err)
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

var _ kernel.Deadliner = (*Filter)(nil)

// CallTimeout is For the call's method: the engine gives the call that
// deadline in its own context, so that Invoke finds it set.
func (f *Filter) CallTimeout(info *kernel.CallInfo) time.Duration { return f.For(info.Method) }
