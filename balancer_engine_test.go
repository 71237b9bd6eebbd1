package kernrpc_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// countingBalancer round-robins and counts its picks and their ends.
type countingBalancer struct {
	heldSet
	next        int
	picks, done atomic.Int64
	refuse      error // returned by Pick when set
	once        bool  // the first pick alone succeeds; later ones get refuse
}

// registerLastBalancer registers a test balancer of type T under name,
// keeping the last one made in last for the test to reach.
func registerLastBalancer[T any, B interface {
	*T
	kernel.Balancer
}](name string, last *atomic.Pointer[T]) {
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: name, New: func(any) (kernel.Balancer, error) {
		b := B(new(T))
		last.Store(b)
		return b, nil
	}})
}

// holdAt holds a test balancer's call where its gate was set (gate not
// nil): it says so on reached, then waits for the gate to open.
func holdAt(gate, reached chan struct{}) {
	if gate != nil {
		reached <- struct{}{}
		<-gate
	}
}

// heldSet is the set a test balancer was given last, and its Update.
type heldSet struct {
	mu  sync.Mutex
	set []kernel.Instance
}

func (b *heldSet) Update(set []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set = set
}

func (b *countingBalancer) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	if b.refuse != nil && (!b.once || b.picks.Load() > 0) {
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
	registerLastBalancer("test-counting", &lastCounting)
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-refusing", New: func(any) (kernel.Balancer, error) {
		return &countingBalancer{refuse: kernel.Errorf(kernel.InvalidArgument, "this call carries no hash key")}, nil
	}})
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-first-pick-only", New: func(any) (kernel.Balancer, error) {
		return &countingBalancer{once: true, refuse: kernel.Errorf(kernel.Unavailable, "the instances moved")}, nil
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

// A retry whose last attempt got no instance returns no response
// metadata: what the earlier attempt's answer carried is not the call's.
func TestARetryWithNoInstanceLeftReturnsNoEarlierMetadata(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Down", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			kernrpc.CallInfoFrom(ctx).SetResponseMetadata("from", "the first attempt")
			return nil, kernel.Errorf(kernel.Unavailable, "dependency down")
		})
	})
	cfg.Balancer = kernrpc.PluginConfig{Name: "test-first-pick-only"}
	cfg.Filters = []kernrpc.FilterConfig{{Name: "retry", Side: "client", Options: map[string]any{"max_attempts": 2, "backoff": "1ms"}}}
	md, err := newClient(t, cfg).CallWithMetadata(t.Context(), "Echo.Down", &echopb.Echo{}, &echopb.Echo{})
	if st := kernel.StatusOf(err); st.Code != kernel.Unavailable || !strings.Contains(st.Message, "the instances moved") {
		t.Fatalf("err = %v, want the second pick's Unavailable", err)
	}
	if md != nil {
		t.Errorf("response metadata = %v, want none: the last attempt got no answer, and the first's is not the call's", md)
	}
}
