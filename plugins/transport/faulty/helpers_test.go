package faulty_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/faulty"
)

// build makes a faulty transport from options as a config would give them.
func build(t *testing.T, options map[string]any) kernel.Transport {
	t.Helper()
	tr, err := faulty.Factory.Build(options, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// pair returns a dialled and an accepted connection of tr.
func pair(t *testing.T, tr kernel.Transport) (dialed, accepted kernel.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := tr.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if dialed, err = tr.Dial(ctx, ln.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close() })
	if accepted, err = ln.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { accepted.Close() })
	return dialed, accepted
}

// payloadOf is the payload request id carries: recognisable, and long
// enough for a flipped or cut byte to land in it.
func payloadOf(id uint64) []byte { return []byte(fmt.Sprintf("payload of call %06d ........", id)) }

// sendRequests writes n requests with call ids 1..n, each payload in a
// buffer of the connection as the engine would encode it.
func sendRequests(t *testing.T, c kernel.Conn, n int) []error {
	t.Helper()
	errs := make([]error, n)
	for i := range n {
		id := uint64(i + 1)
		p := append(c.Buffer(64), payloadOf(id)...)
		errs[i] = c.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: id,
			Method: "Echo.Say", Codec: "raw", Metadata: kernel.Metadata{"k": "v"}, Payload: p})
	}
	return errs
}

// received is one frame read, copied out of the transport's memory.
type received struct {
	typ     kernel.FrameType
	id      uint64
	method  string
	payload []byte
}

// readFor reads frames until none arrives for quiet, or the connection
// fails; it returns what came and the error, if any.
func readFor(c kernel.Conn, quiet time.Duration) ([]received, error) {
	return readUpTo(c, -1, quiet)
}

// readUpTo is readFor that also stops once want frames came (want < 0:
// no such bound).
func readUpTo(c kernel.Conn, want int, quiet time.Duration) ([]received, error) {
	var out []received
	for len(out) != want {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		f, err := c.ReadFrame(ctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && c.Err() == nil {
				return out, nil
			}
			return out, err
		}
		out = append(out, received{f.Type, f.CallID, f.Method, bytes.Clone(f.Payload)})
		f.Release()
	}
	return out, nil
}

func ids(rs []received) []uint64 {
	out := make([]uint64, len(rs))
	for i, r := range rs {
		out[i] = r.id
	}
	return out
}
