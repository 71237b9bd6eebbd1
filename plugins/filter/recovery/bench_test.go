package recovery_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/recovery"
)

var okResp any = &struct{}{}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// BenchmarkInvoke is one call through the filter with a trivial next that
// does not panic, against next alone.
func BenchmarkInvoke(b *testing.B) {
	f, _ := recovery.New(recovery.DefaultOptions())
	ctx := context.Background()
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide}
	b.Run("without", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = okNext(ctx, info, nil)
		}
	})
	b.Run("with", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = f.Invoke(ctx, info, nil, okNext)
		}
	})
}
