package kernrpc_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

type passFilter struct{}

func (passFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "bench-pass", New: func(any) (kernel.Filter, error) { return passFilter{}, nil }})
}

// BenchmarkPipeline measures a 16 B call over tcp-lv to a server in its own
// process, with no filter and with one pass-through filter on each side,
// at 1 and 64 callers; allocs/op counts the client's. The server=inproc
// cases run the server in this process, so allocs/op counts both sides'.
func BenchmarkPipeline(b *testing.B) {
	b.Run("server=process", func(b *testing.B) { benchmarkPipeline(b, false) })
	b.Run("server=inproc", func(b *testing.B) { benchmarkPipeline(b, true) })
}

func benchmarkPipeline(b *testing.B, inproc bool) {
	for _, filtered := range []bool{false, true} {
		for _, callers := range []int{1, 64} {
			name := fmt.Sprintf("filters=%d/callers=%d", map[bool]int{false: 0, true: 1}[filtered], callers)
			b.Run(name, func(b *testing.B) {
				if filtered {
					os.Setenv("KERNRPC_HELPER_FILTER", "bench-pass")
					defer os.Unsetenv("KERNRPC_HELPER_FILTER")
				}
				cfg := testConfig(b)
				if inproc {
					if filtered {
						cfg.Filters = []kernrpc.FilterConfig{{Name: "bench-pass", Side: "server"}}
					}
					startServer(b, cfg, nil)
				} else {
					_, addr := startServerProcessTB(b)
					cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
				}
				if filtered {
					cfg.Filters = []kernrpc.FilterConfig{{Name: "bench-pass", Side: "client"}}
				}
				benchEcho16(b, newClient(b, cfg), callers)
			})
		}
	}
}

// benchEcho16 calls Echo.Echo with 16 B from about callers goroutines.
func benchEcho16(b *testing.B, cli *kernrpc.Client, callers int) {
	req := &echopb.Echo{Payload: make([]byte, 16)}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism((callers + 1) / 2)
	reportCPU(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			var resp echopb.Echo
			for pb.Next() {
				if err := cli.Call(ctx, "Echo.Echo", req, &resp); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// reportCPU runs run and reports the CPU time this process (the client and
// the server, both here) spent per op: what a call costs in resources. At
// one caller a call's latency also holds the wake-ups between the two
// sides, whose spread (several hundred ns from run to run here) hides
// differences of a few hundred ns that CPU time shows.
func reportCPU(b *testing.B, run func()) {
	before := processCPU()
	run()
	b.ReportMetric(float64(processCPU()-before)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPlain64KiB is a 64 KiB echo of a plain protoc-gen-go message
// (wrapperspb.BytesValue, no vtprotobuf methods), the default path, with
// the server in this process: allocs/op counts both sides. protobuf-go
// copies a bytes field into fresh memory on every Unmarshal, one 64 KiB
// allocation per side, which the profile shows as most of memmove.
func BenchmarkPlain64KiB(b *testing.B) {
	cfg := testConfig(b)
	startServer(b, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Bytes", func(_ context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
			return req, nil
		})
	})
	cli := newClient(b, cfg)
	req := &wrapperspb.BytesValue{Value: make([]byte, 64<<10)}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(64 << 10)
	for b.Loop() {
		var resp wrapperspb.BytesValue
		if err := cli.Call(ctx, "Echo.Bytes", req, &resp); err != nil {
			b.Fatal(err)
		}
	}
}
