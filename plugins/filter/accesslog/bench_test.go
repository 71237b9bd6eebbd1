package accesslog_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/accesslog"
)

var okResp any = &echopb.Echo{Text: "hello"}

func okNext(context.Context, *kernel.CallInfo, any) (any, error) { return okResp, nil }

// BenchmarkInvoke is one call through the filter with a trivial next: not
// sampled (sample 0), and logged to a text handler writing to io.Discard.
func BenchmarkInvoke(b *testing.B) {
	req := &echopb.Echo{Text: "hello"}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, bc := range []struct {
		name   string
		sample float64
	}{{"without", -1}, {"unsampled", 0}, {"sample=0.01", 0.01}, {"logged", 1}} {
		invoke := func(ctx context.Context, info *kernel.CallInfo) (any, error) { return okNext(ctx, info, req) }
		if bc.sample >= 0 {
			f, err := accesslog.New(&accesslog.Options{Sample: bc.sample, Level: "INFO", ErrorLevel: "WARN", Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			invoke = func(ctx context.Context, info *kernel.CallInfo) (any, error) { return f.Invoke(ctx, info, req, okNext) }
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "10.0.0.1:5000"}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := invoke(ctx, info); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
