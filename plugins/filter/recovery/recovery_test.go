package recovery_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/recovery"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, recovery.Factory, plugintest.FilterConfig{})
}

// enginetest.LogBuffer is a log destination safe for concurrent writes.
func TestPanicBecomesInternalLoggedWithItsStack(t *testing.T) {
	for _, stack := range []bool{true, false} {
		var out enginetest.LogBuffer
		f, _ := recovery.New(&recovery.Options{Stack: stack, Logger: slog.New(slog.NewTextHandler(&out, nil))})
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "10.0.0.1:5000"}
		resp, err := f.Invoke(context.Background(), info, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
			var m map[string]int
			//lint:ignore SA5000 a nil map write: the runtime panic the test needs
			m["boom"]++
			return "unreachable", nil
		})
		if resp != nil || kernel.CodeOf(err) != kernel.Internal ||
			!strings.Contains(err.Error(), "recover: Echo.Who panicked on the server side: assignment to entry in nil map") {
			t.Fatalf("stack %v: %v, %v; want Internal saying what panicked", stack, resp, err)
		}
		log := out.String()
		for _, want := range []string{"level=ERROR", "method=Echo.Who", "peer=10.0.0.1:5000", "side=server", "assignment to entry in nil map"} {
			if !strings.Contains(log, want) {
				t.Errorf("stack %v: the log line does not say %q: %s", stack, want, log)
			}
		}
		if got := strings.Contains(log, "recovery_test.TestPanicBecomesInternal"); got != stack {
			t.Errorf("stack %v: the log has the panicking function: %v", stack, got)
		}
	}
}

func TestNoPanicPassesThrough(t *testing.T) {
	f, _ := recovery.New(recovery.DefaultOptions())
	want := errors.New("plain")
	_, err := f.Invoke(context.Background(), &kernel.CallInfo{Method: "Echo.Who"}, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { return nil, want })
	if err != want {
		t.Errorf("next's error came back as %v", err)
	}
}

// outcomes is a test filter that records the codes of the calls it sees
// end: what a log or metrics filter before recover would see.
type outcomes struct {
	mu    sync.Mutex
	codes []kernel.Code
}

func (o *outcomes) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	resp, err := next(ctx, info, req)
	o.mu.Lock()
	o.codes = append(o.codes, kernel.CodeOf(err))
	o.mu.Unlock()
	return resp, err
}

func (o *outcomes) seen() []kernel.Code {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]kernel.Code(nil), o.codes...)
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-outcomes", New: func(any) (kernel.Filter, error) { return &outcomes{}, nil }})
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-panic", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if info.Metadata["panic"] == "yes" {
				panic("client filter bug")
			}
			return next(ctx, info, req)
		}), nil
	}})
}

func testConfig(t *testing.T) *kernrpc.Config { return enginetest.Config(t) }

// Over the engine, on both sides: a handler's panic reaches the caller as
// Internal, the filter before recover sees it as such, and the server
// goes on serving; on the client, a panicking client filter after recover
// fails its call instead of the caller's program.
func TestOverTheEngine(t *testing.T) {
	cfg := testConfig(t)
	srv := enginetest.Serve(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: "test-outcomes", Side: "server"},
		kernrpc.FilterConfig{Name: recovery.Name, Side: "server", Options: map[string]any{"stack": false}}), func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			if req.Text == "panic" {
				panic("handler bug")
			}
			return &echopb.Echo{Text: "fine"}, nil
		})
	})
	cli := enginetest.Dial(t, enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: recovery.Name, Side: "client", Options: map[string]any{"stack": false}},
		kernrpc.FilterConfig{Name: "test-panic", Side: "client"}))

	err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{Text: "panic"}, &echopb.Echo{})
	t.Logf("a handler's panic: %v", err)
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "recover: Echo.Who panicked on the server side: handler bug") {
		t.Errorf("a handler's panic: %v; want Internal from the recover filter", err)
	}
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil || resp.Text != "fine" {
		t.Errorf("the call after the panic: %v, %q; want the server still serving", err, resp.Text)
	}
	obs, _ := kernrpc.FindPlugin[*outcomes](srv.Plugins(), "test-outcomes")
	if got := obs.seen(); len(got) != 2 || got[0] != kernel.Internal || got[1] != kernel.OK {
		t.Errorf("the filter before recover saw %v, want [Internal OK]", got)
	}

	ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"panic": "yes"})
	err = cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	t.Logf("a client filter's panic: %v", err)
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "panicked on the client side: client filter bug") {
		t.Errorf("a client filter's panic: %v; want Internal from the recover filter", err)
	}
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &resp); err != nil {
		t.Errorf("the client's next call: %v", err)
	}
}

// pickCounter picks the first instance and counts its picks and the ends
// the client reports of them (kernel.PickObserver), as least-load counts
// the calls in flight on each instance.
type pickCounter struct {
	mu           sync.Mutex
	instances    []kernel.Instance
	picks, dones atomic.Int64
}

func (b *pickCounter) Update(instances []kernel.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.instances = instances
}

func (b *pickCounter) Pick(ctx context.Context, info *kernel.CallInfo) (*kernel.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.instances) == 0 {
		return nil, kernel.ErrNoInstances
	}
	b.picks.Add(1)
	return &b.instances[0], nil
}

func (b *pickCounter) Done(*kernel.Instance, error) { b.dones.Add(1) }

func init() {
	kernel.RegisterBalancer(kernel.Factory[kernel.Balancer]{Name: "test-pick-counter", New: func(any) (kernel.Balancer, error) {
		return &pickCounter{}, nil
	}})
}

// A panic in an attempt filter, which recover in the call stage makes the
// call's error, still ends the pick it happened after: a balancer that
// counts calls in flight per instance (least-load) would otherwise count
// one there for ever, and steer calls away from the instance.
func TestAttemptFilterPanicEndsItsPick(t *testing.T) {
	cfg := testConfig(t)
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return &echopb.Echo{Text: "fine"}, nil
		})
	})
	ccfg := enginetest.WithFilters(cfg, kernrpc.FilterConfig{Name: recovery.Name, Side: "client", Options: map[string]any{"stack": false}},
		kernrpc.FilterConfig{Name: "test-panic", Side: "client", Stage: "attempt"})
	ccfg.Balancer = kernrpc.PluginConfig{Name: "test-pick-counter"}
	cli := enginetest.Dial(t, ccfg)
	b, _ := kernrpc.FindPlugin[*pickCounter](cli.Plugins(), "test-pick-counter")

	ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"panic": "yes"})
	if err := cli.Call(ctx, "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.Internal {
		t.Fatalf("an attempt filter's panic: %v; want Internal from the recover filter", err)
	}
	if err := cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	if picks, dones := b.picks.Load(), b.dones.Load(); picks != dones {
		t.Errorf("the balancer picked %d times and was told of %d ends; want every pick ended, the panicked one too", picks, dones)
	}
}
