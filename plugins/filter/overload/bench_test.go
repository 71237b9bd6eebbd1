package overload_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/overload"
)

var okResp any = &struct{}{}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// BenchmarkAdmitInvoke is one server call through the filter, Admit then
// Invoke, with a trivial next, against next alone.
func BenchmarkAdmitInvoke(b *testing.B) {
	for _, bc := range []struct {
		name    string
		options map[string]any
	}{
		{"without", nil},
		{"gradient", map[string]any{}},
		{"codel", map[string]any{"mode": "codel"}},
	} {
		call := func(ctx context.Context, info *kernel.CallInfo) (any, error) { return okNext(ctx, info, nil) }
		if bc.options != nil {
			f, err := overload.Factory.Build(bc.options, "bench")
			if err != nil {
				b.Fatal(err)
			}
			a := f.(kernel.Admitter)
			call = func(ctx context.Context, info *kernel.CallInfo) (any, error) {
				if err := a.Admit(ctx, info); err != nil {
					return nil, err
				}
				return f.Invoke(ctx, info, nil, okNext)
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := call(ctx, info); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide}
				for pb.Next() {
					if _, err := call(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkReject is one call Admit rejects: the limit is full.
func BenchmarkReject(b *testing.B) {
	f, err := overload.Factory.Build(map[string]any{"initial_limit": 1, "min_limit": 1}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	hold, release := make(chan struct{}), make(chan struct{})
	go f.Invoke(context.Background(), &kernel.CallInfo{Side: kernel.ServerSide}, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
		close(hold)
		<-release
		return okResp, nil
	})
	<-hold
	defer close(release)
	a := f.(kernel.Admitter)
	ctx := context.Background()
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide}
	b.ReportAllocs()
	for b.Loop() {
		if a.Admit(ctx, info) == nil {
			b.Fatal("admitted over the limit")
		}
	}
}
