package breaker_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
)

var okResp any = &struct{}{}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// BenchmarkInvoke is one attempt through the filter with a trivial next,
// on the happy path (a closed breaker), against next alone.
func BenchmarkInvoke(b *testing.B) {
	inst := &kernel.Instance{Address: "10.0.0.1:7000"}
	for _, bc := range []struct {
		name    string
		options map[string]any
	}{
		{"without", nil},
		{"ratio-time", map[string]any{}},
		{"ratio-count", map[string]any{"window": "count"}},
		{"sre-time", map[string]any{"mode": "sre"}},
	} {
		invoke := func(ctx context.Context, info *kernel.CallInfo) (any, error) { return okNext(ctx, info, nil) }
		if bc.options != nil {
			f, err := breaker.Factory.Build(bc.options, "bench")
			if err != nil {
				b.Fatal(err)
			}
			invoke = func(ctx context.Context, info *kernel.CallInfo) (any, error) { return f.Invoke(ctx, info, nil, okNext) }
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Peer: inst.Address, Instance: inst}
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
				info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Peer: inst.Address, Instance: inst}
				for pb.Next() {
					if _, err := invoke(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
