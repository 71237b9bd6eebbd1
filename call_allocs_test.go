package kernrpc_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/plainpb"
	"github.com/kernrpc/kernrpc/internal/raceflag"
)

// A unary call on the default path (plain protoc-gen-go messages, tcp-lv,
// protobuf, no options), under a caller's ctx that can be canceled and
// is used again for every call, allocates three times across both sides:
// the response's payload on the client; on the server, the call's
// context together with its request (Handle makes them in one), and the
// request's payload. protobuf-go allocates both payloads.
func TestDefaultPathCallAllocations(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("the race detector allocates")
	}
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Plain.Echo", func(_ context.Context, req *plainpb.Echo) (*plainpb.Echo, error) { return req, nil })
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, resp := &plainpb.Echo{Payload: make([]byte, 16)}, &plainpb.Echo{}
	call := func() {
		if err := cli.Call(ctx, "Plain.Echo", req, resp); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		call()
	}
	if n := testing.AllocsPerRun(1000, call); n > 3 {
		t.Errorf("a 16 B call on the default path: %.2f allocations, client and server together; want at most 3", n)
	}
}
