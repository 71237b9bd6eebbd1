package kernrpc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	_ "github.com/kernrpc/kernrpc/plugins/filter/timeout"
)

// BenchmarkDeadline is a 16 B call with the server in this process
// (allocs/op counts both sides): without a deadline and without filters,
// through a pass-through filter, with a deadline the caller set, and with
// one the timeout filter gives it, in place of the pass-through filter so
// that the difference is the filter's cost: on both sides ("pass",
// "filter"), on the client only (the deadline then reaches the server
// with the request) or on the server only (the client sends none).
func BenchmarkDeadline(b *testing.B) {
	for _, bc := range []struct {
		name           string
		client, server string
		timeout        time.Duration
	}{
		{"none", "", "", 0},
		{"pass", "bench-pass", "bench-pass", 0},
		{"caller", "", "", time.Minute},
		{"filter", "timeout", "timeout", 0},
		{"client-pass", "bench-pass", "", 0},
		{"client-filter", "timeout", "", 0},
		{"server-pass", "", "bench-pass", 0},
		{"server-filter", "", "timeout", 0},
	} {
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", bc.name, callers), func(b *testing.B) {
				cfg := testConfig(b)
				if bc.server != "" {
					cfg.Filters = []kernrpc.FilterConfig{{Name: bc.server, Side: "server"}}
				}
				startServer(b, cfg, nil)
				cfg.Filters = nil
				if bc.client != "" {
					cfg.Filters = []kernrpc.FilterConfig{{Name: bc.client, Side: "client"}}
				}
				cli := newClient(b, cfg)
				if bc.timeout > 0 {
					benchEcho16Deadline(b, cli, callers, bc.timeout)
				} else {
					benchEcho16(b, cli, callers)
				}
			})
		}
	}
}

// benchEcho16Deadline is benchEcho16 with a deadline d on every call.
func benchEcho16Deadline(b *testing.B, cli *kernrpc.Client, callers int, d time.Duration) {
	req := &echopb.Echo{Payload: make([]byte, 16)}
	b.ReportAllocs()
	b.SetParallelism((callers + 1) / 2)
	reportCPU(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			var resp echopb.Echo
			for pb.Next() {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				err := cli.Call(ctx, "Echo.Echo", req, &resp)
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
