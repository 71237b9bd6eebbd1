package kernrpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// optionalCounts counts the calls of each method of the "test-optional"
// codec, the protobuf codec under another name, on both sides at once.
type optionalCounts struct {
	marshal, marshalSized, unmarshal, unmarshalFresh atomic.Int64
}

type optionalCodec struct {
	protobuf.Codec
	n *optionalCounts
}

func (c optionalCodec) Name() string { return "test-optional" }

func (c optionalCodec) Marshal(dst []byte, v any) ([]byte, error) {
	c.n.marshal.Add(1)
	return c.Codec.Marshal(dst, v)
}

func (c optionalCodec) MarshalSized(dst []byte, v any, size int) ([]byte, error) {
	c.n.marshalSized.Add(1)
	return c.Codec.MarshalSized(dst, v, size)
}

func (c optionalCodec) Unmarshal(data []byte, v any) error {
	c.n.unmarshal.Add(1)
	return c.Codec.Unmarshal(data, v)
}

func (c optionalCodec) UnmarshalFresh(data []byte, v any) error {
	c.n.unmarshalFresh.Add(1)
	return c.Codec.UnmarshalFresh(data, v)
}

var optionalCodecCounts = new(optionalCounts)

func init() {
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-optional",
		Doc:  "protobuf, counting which of its optional methods the engine calls (kernel tests)",
		New:  func(any) (kernel.Codec, error) { return optionalCodec{n: optionalCodecCounts}, nil },
	})
}

// The engine encodes through MarshalSized once it has sized a message,
// and decodes through UnmarshalFresh exactly into the values it has just
// made and nobody else has seen: a Handle's request, a typed Recv's
// message without stream filters. A caller's reply, a Register's request
// and a message stream filters see are decoded with Unmarshal.
func TestEngineCallsTheCodecsOptionalMethodsWhereTheyHold(t *testing.T) {
	n := optionalCodecCounts
	for _, tc := range []struct {
		name        string
		filters     bool
		call        func(t *testing.T, cli *kernrpc.Client)
		sized       int64 // MarshalSized calls; never Marshal
		fresh, full int64 // UnmarshalFresh and Unmarshal calls
	}{
		{"Handle's request", false, func(t *testing.T, cli *kernrpc.Client) {
			callEcho(t, cli, "Echo.Echo")
		}, 2, 1, 1},
		{"Register's request", false, func(t *testing.T, cli *kernrpc.Client) {
			callEcho(t, cli, "Echo.Registered")
		}, 2, 0, 2},
		{"typed Recv", false, func(t *testing.T, cli *kernrpc.Client) { // the server's request too
			recvAll(t, cli, 5)
		}, 6, 6, 0},
		{"typed Recv through a stream filter", true, func(t *testing.T, cli *kernrpc.Client) {
			recvAll(t, cli, 5)
		}, 6, 0, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Codec.Name = "test-optional"
			if tc.filters {
				cfg.Filters = []kernrpc.FilterConfig{{Name: "test-tap"}}
			}
			startServer(t, cfg, func(srv *kernrpc.Server) {
				streamHandlers(srv)
				if err := srv.Register("Echo.Registered", func() any { return new(echopb.Echo) }, func(_ context.Context, req any) (any, error) {
					return req, nil
				}); err != nil {
					t.Fatal(err)
				}
			})
			cli := newClient(t, cfg)
			callEcho(t, cli, "Echo.Echo") // the connection is up
			*n = optionalCounts{}
			tc.call(t, cli)
			if got := n.marshal.Load(); got != 0 {
				t.Errorf("Marshal called %d times; want every message encoded through MarshalSized", got)
			}
			if got := n.marshalSized.Load(); got != tc.sized {
				t.Errorf("MarshalSized called %d times, want %d", got, tc.sized)
			}
			if got, want := [2]int64{n.unmarshalFresh.Load(), n.unmarshal.Load()}, [2]int64{tc.fresh, tc.full}; got != want {
				t.Errorf("UnmarshalFresh, Unmarshal called %v times, want %v", got, want)
			}
		})
	}
}

func callEcho(t *testing.T, cli *kernrpc.Client, method string) {
	t.Helper()
	var resp echopb.Echo
	if err := cli.Call(context.Background(), method, &echopb.Echo{Text: "hi"}, &resp); err != nil || resp.Text != "hi" {
		t.Fatalf("%s = %q, %v; want hi back", method, resp.Text, err)
	}
}

// recvAll reads Count.Up's n messages with the typed Recv.
func recvAll(t *testing.T, cli *kernrpc.Client, n int) {
	t.Helper()
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up", &echopb.Echo{Text: strconv.Itoa(n)})
	if err != nil {
		t.Fatal(err)
	}
	if err := readCount(st, n); err != nil {
		t.Fatal(err)
	}
}

// readCount reads a Count.Up stream to its end, reporting what went wrong.
func readCount(st kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo], want int) error {
	for got := 0; ; got++ {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if got != want {
				return fmt.Errorf("the stream ended after %d messages; want %d", got, want)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if got >= want || m.Text != strconv.Itoa(got) {
			return fmt.Errorf("message %d reads %q; want %d messages numbered in order", got, m.Text, want)
		}
	}
}
