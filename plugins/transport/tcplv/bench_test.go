package tcplv

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// pingPong returns one round trip of a payload of n bytes through an echo
// peer: Buffer, WriteFrame, ReadFrame, Release, as a lone caller does.
func pingPong(tb testing.TB, n int) func() {
	c := dial(tb, newTransport(tb, testOptions()), startEchoPeer(tb))
	src := pattern(n, 1)
	f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: "Echo.Say", Codec: "protobuf"}
	ctx := context.Background()
	return func() {
		f.CallID++
		f.Payload = append(c.Buffer(n), src...)
		if err := c.WriteFrame(f); err != nil {
			tb.Fatal(err)
		}
		r, err := c.ReadFrame(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		if r.CallID != f.CallID || len(r.Payload) != n || r.Method != f.Method {
			tb.Fatalf("echo of call %d came back as call %d with %d bytes", f.CallID, r.CallID, len(r.Payload))
		}
		r.Release()
	}
}

func TestPingPongAllocatesNothingOnceWarm(t *testing.T) {
	roundTrip := pingPong(t, 16)
	for range 100 {
		roundTrip()
	}
	if n := testing.AllocsPerRun(1000, roundTrip); n != 0 {
		t.Fatalf("%v allocations per WriteFrame+ReadFrame+Release of 16 B, want 0", n)
	}
}

func benchmarkPingPong(b *testing.B, n int) {
	roundTrip := pingPong(b, n)
	roundTrip()
	b.SetBytes(int64(2 * n))
	b.ReportAllocs()
	for b.Loop() {
		roundTrip()
	}
}

func BenchmarkPingPong16B(b *testing.B)   { benchmarkPingPong(b, 16) }
func BenchmarkPingPong64KiB(b *testing.B) { benchmarkPingPong(b, 64<<10) }

// BenchmarkBareSocketPingPong16B is the floor the tcp-lv numbers compare
// with: the same bytes through the same echo peer on a plain socket.
func BenchmarkBareSocketPingPong16B(b *testing.B) {
	nc, err := net.Dial("tcp", startEchoPeer(b))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	msg := encode(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: "Echo.Say", Codec: "protobuf", Payload: pattern(16, 1)})
	back := make([]byte, len(msg))
	b.SetBytes(2 * 16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nc.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, back); err != nil {
			b.Fatal(err)
		}
	}
}
