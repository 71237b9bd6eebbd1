//go:build linux

package shmring

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/codec/flatbuffers"
	"github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// BenchmarkEcho calls echo through the kernel's client and server, the
// server in a process of its own as deployed, over shm-ring and, for
// comparison, tcp-lv over loopback, in protobuf (decoded by copying) and
// flatbuffers (read in place: over shm-ring, in the ring itself). calls/s
// counts every caller's calls.
//
//	go test -run '^$' -bench Echo -benchtime 2s ./plugins/transport/shmring/
func BenchmarkEcho(b *testing.B) {
	for _, transport := range []string{Name, tcplv.Name} {
		b.Run(transport, func(b *testing.B) {
			addr := "127.0.0.1:0"
			if transport == Name {
				addr = socketIn(b)
			}
			h := startHelper(b, "server", addr, nil, transportEnv+"="+transport)
			addr = h.expect(b, "READY")
			for _, codec := range []string{"protobuf", "flatbuffers"} {
				for _, size := range []int{16, 64 << 10} {
					for _, callers := range []int{1, 4, 64} {
						b.Run(codec+"/"+sizeName(size)+"/callers="+strconv.Itoa(callers), func(b *testing.B) {
							cfg := clientConfig(addr, nil)
							cfg.Transport.Name = transport
							cfg.Codec.Name = codec
							benchmarkEcho(b, newClient(b, cfg), size, callers)
						})
					}
				}
			}
		})
	}
}

func benchmarkEcho(b *testing.B, cli *kernrpc.Client, size, callers int) {
	payload := pattern(size, 1)
	// call reports failures with Errorf: RunParallel's goroutines must not
	// call Fatal.
	call := func(req, resp *echopb.Echo) bool {
		if err := cli.Call(context.Background(), "Echo.Echo", req, resp); err != nil || len(resp.Payload) != size {
			b.Errorf("echo of %d bytes: %v (%d bytes back)", size, err, len(resp.Payload))
			return false
		}
		return true
	}
	req, resp := &echopb.Echo{Payload: payload}, &echopb.Echo{}
	for range 100 {
		if !call(req, resp) {
			return
		}
	}
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	b.ResetTimer()
	if callers == 1 {
		for b.Loop() {
			if !call(req, resp) {
				return
			}
		}
	} else {
		b.SetParallelism(max(callers/runtime.GOMAXPROCS(0), 1))
		b.RunParallel(func(pb *testing.PB) {
			req, resp := &echopb.Echo{Payload: payload}, &echopb.Echo{}
			for pb.Next() {
				if !call(req, resp) {
					return
				}
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkEchoManyClients has several clients, each with a connection
// and one caller of its own, call one server process: the server's readers
// and the clients' all wait for each other on two cores, and polling that
// holds a core too long shows here first.
//
//	go test -run '^$' -bench EchoManyClients ./plugins/transport/shmring/
func BenchmarkEchoManyClients(b *testing.B) {
	addr := socketIn(b)
	h := startHelper(b, "server", addr, nil, transportEnv+"="+Name)
	addr = h.expect(b, "READY")
	for _, clients := range []int{8, 32} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) {
			clis := make([]*kernrpc.Client, clients)
			for i := range clis {
				clis[i] = newClient(b, clientConfig(addr, nil))
				// Attach before the clock starts.
				if err := clis[i].Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.SetParallelism(max(clients/runtime.GOMAXPROCS(0), 1))
			b.RunParallel(func(pb *testing.PB) {
				cli := clis[int(next.Add(1)-1)%clients]
				req, resp := &echopb.Echo{Payload: pattern(16, 1)}, &echopb.Echo{}
				for pb.Next() {
					if err := cli.Call(context.Background(), "Echo.Echo", req, resp); err != nil {
						b.Error(err) // not Fatal: this is not the benchmark's goroutine
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}

// BenchmarkPingPong is one round trip through an echo peer in another
// process at the transport level (Buffer, WriteFrame, ReadFrame, Release),
// as a lone caller does it: the floor under BenchmarkEcho.
func BenchmarkPingPong(b *testing.B) {
	h := startHelper(b, "echo", socketIn(b), nil)
	addr := h.expect(b, "READY")
	for _, size := range []int{16, 64 << 10} {
		b.Run(sizeName(size), func(b *testing.B) {
			tr := newTransport(b, DefaultOptions())
			c, err := tr.Dial(timeout(b, 10e9), addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			src := pattern(size, 1)
			f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: "Echo.Echo", Codec: "protobuf"}
			ctx := context.Background()
			roundTrip := func() {
				f.CallID++
				f.Payload = append(c.Buffer(size), src...)
				if err := c.WriteFrame(f); err != nil {
					b.Fatal(err)
				}
				r, err := c.ReadFrame(ctx)
				if err != nil || r.CallID != f.CallID || len(r.Payload) != size {
					b.Fatalf("round trip %d: %v", f.CallID, err)
				}
				r.Release()
			}
			for range 100 {
				roundTrip()
			}
			b.SetBytes(int64(2 * size))
			b.ReportAllocs()
			for b.Loop() {
				roundTrip()
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<10 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
