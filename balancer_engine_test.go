package kernrpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// countingBalancer round-robins and counts its picks and their ends.
type countingBalancer struct {
	mu          sync.Mutex
	set         []kernel.Instance
	next        int
	picks, done atomic.Int64
	refuse      error // returned by Pick when set
}

func (b *countingBalancer) Update(set []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set = set
}

func (b *countingBalancer) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	if b.refuse != nil {
		return nil, b.refuse
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return nil, kernel.ErrNoInstances
	}
	b.next++
	b.picks.Add(1)
	return &b.set[b.next%len(b.set)], nil
}

func (b *countingBalancer) Done(*kernel.Instance, error) { b.done.Add(1) }

var lastCounting atomic.Pointer[countingBalancer]

func init() {
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-counting", New: func(any) (kernel.Balancer, error) {
		b := &countingBalancer{}
		lastCounting.Store(b)
		return b, nil
	}})
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-refusing", New: func(any) (kernel.Balancer, error) {
		return &countingBalancer{refuse: kernel.Errorf(kernel.InvalidArgument, "this call carries no hash key")}, nil
	}})
}

// deadAddress is a loopback address nothing listens on.
func deadAddress(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// staticClient is a client of cfg's service whose registry lists addrs.
func staticClient(t *testing.T, cfg *kernrpc.Config, addrs ...string) *kernrpc.Client {
	t.Helper()
	c := *cfg
	list := make([]any, len(addrs))
	for i, a := range addrs {
		list[i] = a
	}
	c.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{
		"namespace": t.Name() + "-static", "static": map[string]any{"echo": list}}}
	return newClient(t, &c)
}

// Every pick the balancer made is ended once, passed-over picks of an
// instance that refused a dial included: least-load counts calls in
// flight by them.
func TestEveryPickIsEnded(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	c := *cfg
	c.Balancer = kernrpc.PluginConfig{Name: "test-counting"}
	cli := staticClient(t, &c, deadAddress(t), srv.Addr())
	b := lastCounting.Load()
	for i := range 20 {
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if p, d := b.picks.Load(), b.done.Load(); p != d || p < 20 {
		t.Errorf("%d picks, %d ended; want every pick ended", p, d)
	}
}

// A balancer's own status code reaches the caller.
func TestBalancerStatusCodeStands(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, nil)
	c := *cfg
	c.Balancer = kernrpc.PluginConfig{Name: "test-refusing"}
	cli := newClient(t, &c)
	err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.InvalidArgument {
		t.Errorf("call: %v, want the balancer's InvalidArgument", err)
	}
}
