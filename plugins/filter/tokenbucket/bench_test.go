package tokenbucket_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
)

var okResp any = &struct{}{}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// BenchmarkInvoke is one call through the filter with a trivial next, on
// the happy path (a token is there), against next alone.
func BenchmarkInvoke(b *testing.B) {
	for _, bc := range []struct {
		name    string
		options map[string]any
	}{
		{"without", nil},
		{"global", map[string]any{"rate": 1e9, "burst": 1000000000}},
		{"method", map[string]any{"rate": 1e9, "burst": 1000000000, "scope": "method"}},
		{"backoff", map[string]any{"rate": 1e9, "burst": 1000000000, "mode": "backoff"}},
	} {
		invoke := func(ctx context.Context, info *kernel.CallInfo) (any, error) { return okNext(ctx, info, nil) }
		if bc.options != nil {
			f, err := tokenbucket.Factory.Build(bc.options, "bench")
			if err != nil {
				b.Fatal(err)
			}
			invoke = func(ctx context.Context, info *kernel.CallInfo) (any, error) { return f.Invoke(ctx, info, nil, okNext) }
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := invoke(ctx, info); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
				for pb.Next() {
					if _, err := invoke(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
