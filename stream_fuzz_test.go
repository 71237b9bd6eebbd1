package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// FuzzStreamFrames sends a server any sequence of stream frames a peer
// could (streams opened with and without credit, data past the window,
// half-closes, grants, cancels, frames for streams that ended, unary
// calls between), then hangs up. The server must not panic, must end
// every handler it started, and must go on serving.
func FuzzStreamFrames(f *testing.F) {
	f.Add([]byte{3, 0, 1, 64, 0, 1, 2, 4, 1, 1, 3, 0x12, 0x01, 0x33, 2, 1, 0, 0})
	f.Add([]byte{3, 0, 1, 1, 0, 2, 0, 1, 1, 2, 200, 0, 1, 2, 200, 0, 4, 2, 0, 0})
	f.Add([]byte{0, 3, 3, 0, 1, 3, 2, 1, 0x0a, 0x01, 5, 0, 0, 0, 4, 3, 0, 0})
	f.Add([]byte{5, 1, 4, 0, 0x12, 0x01, 0x61, 3, 1, 1, 64, 0, 1, 0, 0})
	cfg := testConfig(f)
	cfg.Streams.Window = 4 << 10
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
	srv := startServer(f, cfg, streamHandlers)
	obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	tr, err := kernel.NewTransport("tcp-lv", nil, "")
	if err != nil {
		f.Fatal(err)
	}
	cli := newClient(f, cfg)
	f.Fuzz(func(t *testing.T, data []byte) {
		conn, err := tr.Dial(context.Background(), srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		go func() { // read and drop whatever the server answers
			for {
				f, err := conn.ReadFrame(context.Background())
				if err != nil {
					return
				}
				f.Release()
			}
		}()
		for _, fr := range fuzzFrames(data) {
			if conn.WriteFrame(fr) != nil {
				break
			}
		}
		time.Sleep(time.Millisecond)
		_ = conn.Close()
		if !eventually(5*time.Second, func() bool { return obs.readings(t)["server_streams_open"].Value == 0 }) {
			t.Fatalf("%v stream handlers still running 5s after their connection closed", obs.readings(t)["server_streams_open"].Value)
		}
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "still here"}, &resp); err != nil || resp.Text != "still here" {
			t.Fatalf("server stopped serving: %v", err)
		}
	})
}

var fuzzMethods = []string{"Count.Up", "Count.Join", "Count.Echo", "Count.Wait", "Echo.Echo", "Nope.Nope"}

// fuzzFrames turns fuzz input into frames, four bytes of op each, with
// payloads taken from the input after the op.
func fuzzFrames(data []byte) []*kernel.Frame {
	var out []*kernel.Frame
	for len(data) >= 4 && len(out) < 64 {
		op, id, a, b := data[0], uint64(data[1]%4+1), data[2], data[3]
		data = data[4:]
		take := func(n int) []byte {
			n = min(n, len(data))
			p := append([]byte(nil), data[:n]...)
			data = data[n:]
			return p
		}
		var fr *kernel.Frame
		switch op % 6 {
		case 0:
			fr = &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: id, Method: fuzzMethods[int(a)%len(fuzzMethods)], Credit: uint32(b) << 8}
		case 1:
			fr = &kernel.Frame{Type: kernel.FrameStreamData, CallID: id, Payload: take(int(a))}
			if b%8 == 0 {
				fr.Payload = make([]byte, int(b)<<6) // past a 4 KiB window
			}
		case 2:
			fr = &kernel.Frame{Type: kernel.FrameStreamData, Flags: kernel.FlagEndStream, CallID: id}
		case 3:
			fr = &kernel.Frame{Type: kernel.FrameWindowUpdate, Credit: uint32(b) << 10}
			if a%2 == 1 {
				fr.CallID = id
			}
		case 4:
			fr = &kernel.Frame{Type: kernel.FrameCancel, CallID: id, Code: kernel.Code(a % 5)}
		case 5:
			fr = &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: id + 4, Method: fuzzMethods[int(a)%len(fuzzMethods)], Payload: take(int(b % 16))}
		}
		out = append(out, fr)
	}
	return out
}
