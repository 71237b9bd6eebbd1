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
// through a pass-through filter on each side, with a deadline the caller
// set, and with one the timeout filter gives it (in place of the
// pass-through filters, so that the difference is the filter's cost).
func BenchmarkDeadline(b *testing.B) {
	for _, bc := range []struct {
		name    string
		filter  string
		timeout time.Duration
	}{
		{"none", "", 0},
		{"pass", "bench-pass", 0},
		{"caller", "", time.Minute},
		{"filter", "timeout", 0},
	} {
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", bc.name, callers), func(b *testing.B) {
				cfg := testConfig(b)
				if bc.filter != "" {
					cfg.Filters = []kernrpc.FilterConfig{{Name: bc.filter, Side: "server"}}
				}
				startServer(b, cfg, nil)
				if bc.filter != "" {
					cfg.Filters = []kernrpc.FilterConfig{{Name: bc.filter, Side: "client"}}
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
}
