package prometheus_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/prometheus"
)

var okResp any = "ok"

func okNext(_ context.Context, info *kernel.CallInfo, _ any) (any, error) {
	info.Attempt, info.RequestSize, info.ResponseSize = 1, 16, 21
	return okResp, nil
}

var failed = kernel.Errorf(kernel.Unavailable, "down")

func failNext(_ context.Context, info *kernel.CallInfo, _ any) (any, error) {
	info.Attempt, info.RequestSize = 1, 16
	return nil, failed
}

// BenchmarkInvoke is one call through the filter with a trivial next,
// against next alone ("without"), on each side, failing, with native
// histograms, and from all cores at once (the parallel cases share one
// method's series, the worst case for contention). The observed cases
// add the server's CallEnded after Invoke, as the engine calls it, with
// the answer's size: the filter's whole cost per served call.
func BenchmarkInvoke(b *testing.B) {
	for _, bc := range []struct {
		name     string
		options  map[string]any // nil: without the filter
		side     kernel.Side
		next     kernel.Invoker
		parallel bool
		observed bool // CallEnded after Invoke
	}{
		{"without", nil, kernel.ServerSide, okNext, false, false},
		{"server", map[string]any{}, kernel.ServerSide, okNext, false, false},
		{"server-observed", map[string]any{}, kernel.ServerSide, okNext, false, true},
		{"client", map[string]any{}, kernel.ClientSide, okNext, false, false},
		{"client-failing", map[string]any{}, kernel.ClientSide, failNext, false, false},
		{"server-native", map[string]any{"native_histograms": true}, kernel.ServerSide, okNext, false, false},
		{"without-parallel", nil, kernel.ServerSide, okNext, true, false},
		{"server-parallel", map[string]any{}, kernel.ServerSide, okNext, true, false},
		{"server-observed-parallel", map[string]any{}, kernel.ServerSide, okNext, true, true},
		{"client-parallel", map[string]any{}, kernel.ClientSide, okNext, true, false},
	} {
		next := bc.next
		invoke := func(ctx context.Context, info *kernel.CallInfo) (any, error) { return next(ctx, info, nil) }
		if bc.options != nil {
			f, err := prometheus.Factory.Build(bc.options, "bench")
			if err != nil {
				b.Fatal(err)
			}
			defer f.(*prometheus.Filter).Close()
			invoke = func(ctx context.Context, info *kernel.CallInfo) (any, error) { return f.Invoke(ctx, info, nil, next) }
			if bc.observed {
				o := f.(kernel.CallObserver)
				invoke = func(ctx context.Context, info *kernel.CallInfo) (any, error) {
					resp, err := f.Invoke(ctx, info, nil, next)
					o.CallEnded(info, err, true)
					return resp, err
				}
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			if bc.parallel {
				b.RunParallel(func(pb *testing.PB) {
					info := &kernel.CallInfo{Method: "Echo.Who", Side: bc.side}
					for pb.Next() {
						info.Attempt = 0
						_, _ = invoke(ctx, info)
					}
				})
				return
			}
			info := &kernel.CallInfo{Method: "Echo.Who", Side: bc.side}
			for b.Loop() {
				info.Attempt = 0
				_, _ = invoke(ctx, info)
			}
		})
	}
}

// nopStream takes every message and has none to give.
type nopStream struct{}

func (nopStream) SendMsg(any) error { return nil }
func (nopStream) RecvMsg(any) error { return nil }

// BenchmarkStream is the filter's cost on streams: one message sent
// through the wrapper of a stream the filter passed on (against the bare
// stream), from one goroutine and from all cores at once on streams of
// one method; and a whole stream without messages, opened and ended.
func BenchmarkStream(b *testing.B) {
	f, err := prometheus.Factory.Build(map[string]any{}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer f.(*prometheus.Filter).Close()
	sf := f.(kernel.StreamFilter)
	ctx := context.Background()
	// wrapped hands over the stream as next sees it.
	wrapped := func() kernel.Stream {
		var got kernel.Stream
		_ = sf.InvokeStream(ctx, &kernel.CallInfo{Method: "Chat.Talk", Side: kernel.ServerSide}, nopStream{},
			func(_ context.Context, _ *kernel.CallInfo, st kernel.Stream) error { got = st; return nil })
		return got
	}
	for _, bc := range []struct {
		name string
		st   func() kernel.Stream
	}{{"message/without", func() kernel.Stream { return nopStream{} }}, {"message", wrapped}} {
		b.Run(bc.name, func(b *testing.B) {
			st := bc.st()
			b.ReportAllocs()
			for b.Loop() {
				_ = st.SendMsg(nil)
			}
		})
		b.Run(bc.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				st := bc.st()
				for pb.Next() {
					_ = st.SendMsg(nil)
				}
			})
		})
	}
	b.Run("open-and-end", func(b *testing.B) {
		info := &kernel.CallInfo{Method: "Chat.Talk", Side: kernel.ServerSide}
		next := func(context.Context, *kernel.CallInfo, kernel.Stream) error { return nil }
		b.ReportAllocs()
		for b.Loop() {
			_ = sf.InvokeStream(ctx, info, nopStream{}, next)
		}
	})
}
