package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/plainpb"
)

// benchStreams runs b.N messages of each size from Count.Up's handler to
// the client, over each transport, split over streams streams of one
// connection. (benchmarks/ compares streams with grpc-go across
// processes.)
func benchStreams(b *testing.B, streams int) {
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
				errs := make(chan error, streams)
				for i := range streams {
					n := b.N / streams
					if i == 0 {
						n += b.N % streams
					}
					go func() { errs <- readStream(cli, n, size) }()
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

// readStream opens Count.Up for n messages of size bytes and reads them
// all into one reused message.
func readStream(cli *kernrpc.Client, n, size int) error {
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: strconv.Itoa(n), Payload: make([]byte, size)})
	if err != nil {
		return err
	}
	var m echopb.Echo
	for got := 0; ; got++ {
		if err := st.RecvMsg(&m); errors.Is(err, io.EOF) {
			if got != n {
				return errors.New("stream ended after " + strconv.Itoa(got) + " messages, want " + strconv.Itoa(n))
			}
			return nil
		} else if err != nil {
			return err
		}
	}
}

// BenchmarkServerStream is one server stream's message rate.
func BenchmarkServerStream(b *testing.B) { benchStreams(b, 1) }

// BenchmarkServerStreams16 is 16 streams at once on one connection.
func BenchmarkServerStreams16(b *testing.B) { benchStreams(b, 16) }

// BenchmarkServerStreamDefault is the default path of a 16 B server
// stream: plain protoc-gen-go messages, a new one per typed Recv, as
// benchmarks/ runs it across processes. cpu-ns/op counts both sides.
func BenchmarkServerStreamDefault(b *testing.B) {
	cfg := testConfig(b)
	startServer(b, cfg, func(s *kernrpc.Server) {
		kernrpc.HandleServerStream(s, "Plain.Up", func(ctx context.Context, req *plainpb.Echo, st kernrpc.ServerStreamOf[plainpb.Echo, plainpb.Echo]) error {
			n, err := strconv.Atoi(req.Text)
			if err != nil {
				return err
			}
			m := &plainpb.Echo{Payload: req.Payload}
			for range n {
				if err := st.Send(m); err != nil {
					return err
				}
			}
			return nil
		})
	})
	cli := newClient(b, cfg)
	b.ReportAllocs()
	reportCPU(b, func() {
		st, err := kernrpc.OpenServerStream[plainpb.Echo, plainpb.Echo](context.Background(), cli, "Plain.Up", &plainpb.Echo{Text: strconv.Itoa(b.N), Payload: make([]byte, 16)})
		if err != nil {
			b.Fatal(err)
		}
		for got := 0; ; got++ {
			if _, err := st.Recv(); errors.Is(err, io.EOF) {
				if got != b.N {
					b.Fatalf("stream ended after %d messages, want %d", got, b.N)
				}
				return
			} else if err != nil {
				b.Fatal(err)
			}
		}
	})
}
