package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// BenchmarkServerStream measures one server stream's message rate: b.N
// messages of the given size from the handler to the client, over each
// transport. (benchmarks/ compares it with grpc-go across processes.)
func BenchmarkServerStream(b *testing.B) {
	for _, tr := range streamTransports {
		for _, size := range []int{16, 64 << 10} {
			b.Run(tr+"/"+strconv.Itoa(size)+"B", func(b *testing.B) {
				cfg := testConfig(b)
				if tr != "tcp-lv" {
					cfg.Transport.Name, cfg.Transport.Options = tr, nil
					if sp := os.Getenv("KERNRPC_BENCH_SPIN"); sp != "" {
						cfg.Transport.Options = map[string]any{"spin": sp}
					}
				}
				if w := os.Getenv("KERNRPC_BENCH_WINDOW"); w != "" {
					n, _ := strconv.Atoi(w)
					cfg.Streams.Window = kernel.Size(n)
				}
				startServer(b, cfg, streamHandlers)
				cli := newClient(b, cfg)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: strconv.Itoa(b.N), Payload: make([]byte, size)})
				if err != nil {
					b.Fatal(err)
				}
				var m echopb.Echo
				for n := 0; ; n++ {
					if err := st.RecvMsg(&m); errors.Is(err, io.EOF) {
						if n != b.N {
							b.Fatalf("%d messages, want %d", n, b.N)
						}
						break
					} else if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkServerStreams16 is BenchmarkServerStream with 16 streams at
// once on one connection, b.N messages in all.
func BenchmarkServerStreams16(b *testing.B) {
	for _, tr := range streamTransports {
		for _, size := range []int{16, 64 << 10} {
			b.Run(tr+"/"+strconv.Itoa(size)+"B", func(b *testing.B) {
				cfg := testConfig(b)
				if tr != "tcp-lv" {
					cfg.Transport.Name, cfg.Transport.Options = tr, nil
				}
				startServer(b, cfg, streamHandlers)
				cli := newClient(b, cfg)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				const streams = 16
				errs := make(chan error, streams)
				for range streams {
					go func() {
						n := b.N / streams
						st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: strconv.Itoa(n), Payload: make([]byte, size)})
						if err != nil {
							errs <- err
							return
						}
						var m echopb.Echo
						for {
							if err := st.RecvMsg(&m); err != nil {
								if errors.Is(err, io.EOF) {
									err = nil
								}
								errs <- err
								return
							}
						}
					}()
				}
				for range streams {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
