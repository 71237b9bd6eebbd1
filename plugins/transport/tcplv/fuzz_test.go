package tcplv

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// FuzzReadFrame writes arbitrary bytes from a peer: ReadFrame returns
// frames, then a clean error once the bytes run out or stop making sense;
// it never panics, hangs or hands out a transport-level frame.
func FuzzReadFrame(f *testing.F) {
	req := encode(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "Echo.Say",
		Codec: "protobuf", Timeout: time.Second, Metadata: kernel.Metadata{"k": "v"}, Payload: []byte("hello")})
	ping := encode(&kernel.Frame{Type: kernel.FramePing, CallID: 2, Payload: []byte("ping")})
	pong := encode(&kernel.Frame{Type: kernel.FramePong})
	resp := encode(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Code: kernel.Internal, Message: "boom"})
	large := encode(&kernel.Frame{Type: kernel.FrameStreamData, Payload: pattern(600, 9)})
	for _, seed := range [][]byte{
		req,
		append(append(append(ping, req...), pong...), resp...),
		large,
		append(large, req[:7]...),
		{0xff, 0xff, 0xff, 0xf0},
		{0, 0, 0, 5},
		{},
	} {
		f.Add(seed)
	}
	o := testOptions()
	o.MaxFrameSize = 64 << 10
	o.ReadBufferSize = 16 // refill the read buffer at every possible boundary
	tr := newTransport(f, o)

	f.Fuzz(func(t *testing.T, data []byte) {
		local, peer := net.Pipe()
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			peer.Write(data)
			peer.Close()
		}()
		defer func() { <-sent }()
		c := newConn(tr, local, local, true)
		defer c.Close() // first, so that a blocked peer.Write returns
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			fr, err := c.ReadFrame(ctx)
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("ReadFrame hung on %d bytes of input", len(data))
				}
				if !errors.Is(err, kernel.ErrPeerGone) && !errors.Is(err, kernel.ErrMalformedFrame) && !errors.Is(err, kernel.ErrFrameTooLarge) {
					t.Fatalf("ReadFrame: unexpected error %v", err)
				}
				return
			}
			if fr.Type == kernel.FramePing || fr.Type == kernel.FramePong {
				t.Fatalf("ReadFrame returned a %v frame", fr.Type)
			}
			fr.Release()
		}
	})
}
