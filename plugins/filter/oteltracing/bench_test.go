package oteltracing_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
)

var okResp any = &struct{}{}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// engineCtx is a server's call context as the engine makes it (callctx.go
// at the root): it asks the filter's CallValue (kernel.ContextValuer) for
// the keys it does not hold itself, and keeps the first two answers for
// the rest of the call, read without a lock.
type engineCtx struct {
	context.Context
	valuer kernel.ContextValuer
	info   *kernel.CallInfo
	mu     sync.Mutex
	kept   [2]struct{ key, val any }
	nkept  atomic.Int32
}

func newEngineCtx(f kernel.Filter, info *kernel.CallInfo) *engineCtx {
	return &engineCtx{Context: context.Background(), valuer: f.(kernel.ContextValuer), info: info}
}

func (c *engineCtx) Value(key any) any {
	for i := range c.nkept.Load() {
		if kv := &c.kept[i]; kv.key == key {
			return kv.val
		}
	}
	if v, ok := c.valuer.CallValue(c.info, key); ok {
		c.mu.Lock()
		if n := c.nkept.Load(); int(n) < len(c.kept) {
			c.kept[n].key, c.kept[n].val = key, v
			c.nkept.Store(n + 1)
		}
		c.mu.Unlock()
		return v
	}
	return c.Context.Value(key)
}

// serverCtx is the context a server's filter gets: a handler context
// holding the remote caller's span context, as this filter's server side
// hands it to a handler whose own calls then go through the client side.
func serverCtx(b *testing.B, f kernel.Filter, traceparent string) context.Context {
	var got context.Context
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "127.0.0.1:5000",
		Metadata: kernel.Metadata{"traceparent": traceparent}}
	_, _ = f.Invoke(newEngineCtx(f, info), info, nil, func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
		got = ctx
		return okResp, nil
	})
	return got
}

// BenchmarkFilter is one call through the filter with a trivial next, on
// each side, against the same call without it ("without"). Sampling off
// is sampler never, or an unsampled parent; "recorded" makes a span with
// an SDK provider that drops it, for comparison.
func BenchmarkFilter(b *testing.B) {
	build := func(o *oteltracing.Options) kernel.Filter {
		f, err := oteltracing.New(o)
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	never := build(&oteltracing.Options{Span: "call", Exporter: "none", Sampler: "never", Ratio: 1})
	parent := build(&oteltracing.Options{Span: "call", Exporter: "none", Sampler: "parent-ratio", Ratio: 1})
	recorded := build(&oteltracing.Options{Span: "call", Exporter: "none", Sampler: "always", Ratio: 1,
		TracerProvider: sdktrace.NewTracerProvider()})
	const unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	appCtx, _ := parentCtx(false)
	for _, bc := range []struct {
		name   string
		filter kernel.Filter // nil: without
		side   kernel.Side
		ctx    context.Context
		md     kernel.Metadata
		nilMD  bool
		engine bool // ctx is the engine's call context
	}{
		{name: "client/without", side: kernel.ClientSide},
		{name: "client/never", filter: never, side: kernel.ClientSide},
		{name: "client/unsampled-parent-from-server", filter: parent, side: kernel.ClientSide, ctx: serverCtx(b, parent, unsampled)},
		{name: "client/unsampled-parent-from-server-nil-metadata", filter: parent, side: kernel.ClientSide, ctx: serverCtx(b, parent, unsampled), nilMD: true},
		{name: "client/unsampled-parent-from-app", filter: parent, side: kernel.ClientSide, ctx: appCtx},
		{name: "client/recorded", filter: recorded, side: kernel.ClientSide},
		{name: "server/without", side: kernel.ServerSide, md: kernel.Metadata{"traceparent": unsampled}},
		{name: "server/never-no-traceparent", filter: never, side: kernel.ServerSide},
		{name: "server/unsampled-parent", filter: parent, side: kernel.ServerSide, md: kernel.Metadata{"traceparent": unsampled}, engine: true},
		{name: "server/unsampled-parent-outside-a-server", filter: parent, side: kernel.ServerSide, md: kernel.Metadata{"traceparent": unsampled}},
		{name: "server/recorded", filter: recorded, side: kernel.ServerSide, md: kernel.Metadata{"traceparent": unsampled}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := bc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			md := bc.md
			if md == nil && !bc.nilMD {
				md = kernel.Metadata{}
			}
			info := &kernel.CallInfo{Method: "Echo.Who", Side: bc.side, Peer: "127.0.0.1:5000", Metadata: md}
			if bc.engine {
				ctx = newEngineCtx(bc.filter, info)
			}
			b.ReportAllocs()
			for b.Loop() {
				if bc.nilMD {
					info.Metadata = nil
				} else if bc.side == kernel.ClientSide {
					// Each call's metadata is its own: what the last
					// call's filter added is not there.
					delete(info.Metadata, "traceparent")
				}
				var err error
				if bc.filter == nil {
					_, err = okNext(ctx, info, nil)
				} else {
					_, err = bc.filter.Invoke(ctx, info, nil, okNext)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
