package kernrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// sizeRecorder keeps the sizes filters see once next returns.
type sizeRecorder struct {
	mu    sync.Mutex
	sizes map[kernel.Side][2]int
}

var sizes = &sizeRecorder{sizes: map[kernel.Side][2]int{}}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-sizes", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			sizes.mu.Lock()
			sizes.sizes[info.Side] = [2]int{info.RequestSize, info.ResponseSize}
			sizes.mu.Unlock()
			return resp, err
		}), nil
	}})
}

// Filters see the encoded sizes: the client both once next returns, the
// server the request's (its response is encoded after its filters).
func TestCallInfoCarriesMessageSizes(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-sizes"}}
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Double", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return &echopb.Echo{Text: strings.Repeat(req.Text, 2)}, nil
		})
	})
	cli := newClient(t, cfg)
	req := &echopb.Echo{Text: strings.Repeat("x", 100)}
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Double", req, &resp); err != nil {
		t.Fatal(err)
	}
	reqSize, respSize := proto.Size(req), proto.Size(&resp)
	sizes.mu.Lock()
	defer sizes.mu.Unlock()
	if got := sizes.sizes[kernel.ClientSide]; got != [2]int{reqSize, respSize} {
		t.Errorf("client filter saw sizes %v, want [%d %d]", got, reqSize, respSize)
	}
	if got := sizes.sizes[kernel.ServerSide]; got != [2]int{reqSize, 0} {
		t.Errorf("server filter saw sizes %v, want [%d 0]", got, reqSize)
	}
}
