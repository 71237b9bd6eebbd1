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
	// The rest of the header, so that a test can tell a frame that
	// arrived whole from one altered where it does not look.
	flags    kernel.FrameFlags
	codec    string
	metadata kernel.Metadata
}

// asSent reports whether r is request id exactly as sendRequests wrote it.
func (r received) asSent() bool {
	return r.typ == kernel.FrameRequest && r.flags == kernel.FlagEndStream && r.method == "Echo.Say" && r.codec == "raw" &&
		len(r.metadata) == 1 && r.metadata["k"] == "v" && bytes.Equal(r.payload, payloadOf(r.id))
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
		out = append(out, received{typ: f.Type, id: f.CallID, method: f.Method, payload: bytes.Clone(f.Payload),
			flags: f.Flags, codec: f.Codec, metadata: f.Metadata.Clone()})
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
