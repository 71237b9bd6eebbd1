package kernrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// scriptBalancer picks the instances whose IDs its script lists, in
// turn, over and over.
type scriptBalancer struct {
	heldSet
	script []string
	next   int
}

func (b *scriptBalancer) play(script ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.script, b.next = script, 0
}

func (b *scriptBalancer) Pick(context.Context, *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.script[b.next%len(b.script)]
	b.next++
	for i := range b.set {
		if b.set[i].ID == id {
			return &b.set[i], nil
		}
	}
	return nil, kernel.ErrNoInstances
}

var (
	lastScriptBalancer atomic.Pointer[scriptBalancer]
	// shedOnB is how many more attempts on instance "b" the test-shed-b
	// attempt filter fails, as retryable, without sending them.
	shedOnB atomic.Int32
)

func init() {
	registerLastBalancer("test-script-pick", &lastScriptBalancer)
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-shed-b", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if info.Instance.ID == "b" && shedOnB.Add(-1) >= 0 {
				return nil, &kernel.Status{Code: kernel.ResourceExhausted, Retryable: true, Message: "test: shed"}
			}
			return next(ctx, info, req)
		}), nil
	}})
}

// An instance that refused a dial moments ago is passed over up to
// maxSkippedPicks times for each attempt of a call: a call sent again
// (its first tries were not processed) passes it over as its first try
// did, rather than having spent the passes on earlier tries and sending
// its last try to the instance that refuses.
func TestAvoidedInstancesArePassedOverOnEveryTry(t *testing.T) {
	cfg := testConfig(t)
	reg := handRegistry(t, cfg)
	srv := startServer(t, cfg, nil)
	for _, inst := range []kernel.Instance{
		{Service: "echo", ID: "a", Address: fixedAddress(t, "tcp-lv")}, // nothing listens
		{Service: "echo", ID: "b", Address: srv.Addr()},
	} {
		if err := reg.Register(context.Background(), inst, 0); err != nil {
			t.Fatal(err)
		}
	}
	ccfg := testConfig(t)
	ccfg.Balancer = kernrpc.PluginConfig{Name: "test-script-pick"}
	ccfg.Filters = []kernrpc.FilterConfig{{Name: "test-shed-b", Side: "client", Stage: "attempt"}}
	cli := newClient(t, ccfg) // retries: 2, the default
	b := lastScriptBalancer.Load()

	// a refuses a dial, and is passed over for a second; b answers.
	b.play("a", "b")
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatalf("a call that b answered once a refused it: %v", err)
	}
	// b sheds the first two tries of the next call: each of its three
	// tries passes a over four times before it picks b.
	shedOnB.Store(2)
	defer shedOnB.Store(0)
	b.play("a", "a", "a", "a", "b")
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatalf("a call whose third try b answers: %v\nwant it answered: a, which refused a dial moments ago, should be passed over on every try", err)
	}
}
