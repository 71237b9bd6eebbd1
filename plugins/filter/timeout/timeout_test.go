package timeout_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/timeout"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, timeout.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"default": "5s", "methods": map[string]any{"PluginTest.*": "1s"}},
		BadOptions:    map[string]any{"default": "-1s"},
		BadOptionsKey: "default",
	})
}

func build(t *testing.T, opts map[string]any) *timeout.Filter {
	t.Helper()
	f, err := timeout.Factory.Build(opts, "test")
	if err != nil {
		t.Fatal(err)
	}
	return f.(*timeout.Filter)
}

func TestWhichDeadline(t *testing.T) {
	f := build(t, map[string]any{"default": "1s", "methods": map[string]any{
		"Report.Build": "2m", "Cache.*": "50ms", "Cache.Slow*": "500ms", "Stream.Tail": "0s",
	}})
	for method, want := range map[string]time.Duration{
		"Echo.Who":       time.Second,
		"Report.Build":   2 * time.Minute,
		"Report.Builder": time.Second, // exact names are exact
		"Cache.Get":      50 * time.Millisecond,
		"Cache.SlowScan": 500 * time.Millisecond, // the longest prefix wins
		"Stream.Tail":    0,
	} {
		if got := f.For(method); got != want {
			t.Errorf("For(%q) = %v, want %v", method, got, want)
		}
	}
}

// deadlineSeen calls the filter with ctx and reports the deadline next saw.
func deadlineSeen(f kernel.Filter, ctx context.Context, method string) (time.Duration, bool) {
	var left time.Duration
	var has bool
	f.Invoke(ctx, &kernel.CallInfo{Method: method, Side: kernel.ClientSide}, nil, func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
		var dl time.Time
		dl, has = ctx.Deadline()
		left = time.Until(dl)
		return "ok", nil
	})
	return left, has
}

func TestGivesADeadlineOnlyToCallsWithout(t *testing.T) {
	f := build(t, map[string]any{"default": "1h", "methods": map[string]any{"Stream.Tail": "0s"}})
	if left, has := deadlineSeen(f, context.Background(), "Echo.Who"); !has || left > time.Hour || left < time.Hour-time.Minute {
		t.Errorf("a call without a deadline: next saw %v left (deadline: %v), want about 1h", left, has)
	}
	if _, has := deadlineSeen(f, context.Background(), "Stream.Tail"); has {
		t.Error("a method configured with 0 got a deadline")
	}
	for _, own := range []time.Duration{time.Second, 3 * time.Hour} {
		ctx, cancel := context.WithTimeout(context.Background(), own)
		left, _ := deadlineSeen(f, ctx, "Echo.Who")
		cancel()
		if left > own || left < own-time.Minute {
			t.Errorf("a call with its own deadline of %v: next saw %v left; want the caller's kept", own, left)
		}
	}
	if _, has := deadlineSeen(build(t, map[string]any{"default": "0s"}), context.Background(), "Echo.Who"); has {
		t.Error("default 0 gave a deadline")
	}
}

func TestRunningOutSaysWhichDeadline(t *testing.T) {
	f := build(t, map[string]any{"default": "20ms"})
	block := func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
		<-ctx.Done()
		return nil, kernel.StatusOf(ctx.Err())
	}
	_, err := f.Invoke(context.Background(), &kernel.CallInfo{Method: "Echo.Slow", Side: kernel.ClientSide}, nil, block)
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), "timeout: Echo.Slow ran past the deadline of 20ms the timeout filter gave it") {
		t.Errorf("ran out of the filter's deadline: %v", err)
	}
	// The caller's own cancellation is the caller's, not the filter's.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(5*time.Millisecond, cancel)
	_, err = f.Invoke(ctx, &kernel.CallInfo{Method: "Echo.Slow", Side: kernel.ClientSide}, nil, block)
	if kernel.CodeOf(err) != kernel.Canceled || strings.Contains(err.Error(), "timeout:") {
		t.Errorf("cancelled by the caller: %v", err)
	}
}

func TestBadOptions(t *testing.T) {
	for want, opts := range map[string]map[string]any{
		`option "default"`: {"default": "-1s"},
		`option "methods": "Echo.Who": must not be negative`: {"methods": map[string]any{"Echo.Who": "-1s"}},
		`names no method`: {"methods": map[string]any{"*": "1s"}},
		`option "methods": "Echo.*.Who" has a * before its end`: {"methods": map[string]any{"Echo.*.Who": "1s"}},
	} {
		_, err := timeout.Factory.Build(opts, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("options %v: %v, want an error saying %s", opts, err, want)
		}
	}
}

func testConfig(t *testing.T) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": "timeout-" + t.Name()}
	return cfg
}

// Over the engine: the client's filter gives a call without a deadline
// the method's, which reaches the server; the server's filter bounds a
// handler the client gave no deadline.
func TestOverTheEngine(t *testing.T) {
	cfg := testConfig(t)
	scfg := *cfg
	scfg.Filters = []kernrpc.FilterConfig{{Name: timeout.Name, Side: "server", Options: map[string]any{"default": "0s", "methods": map[string]any{"Echo.Server": "30ms"}}}}
	srv, err := kernrpc.NewServer(&scfg)
	if err != nil {
		t.Fatal(err)
	}
	sawDeadline := make(chan time.Duration, 4)
	slow := func(ctx context.Context, _ *echopb.Echo) (*echopb.Echo, error) {
		dl, ok := ctx.Deadline()
		if !ok {
			sawDeadline <- -1
			return &echopb.Echo{}, nil
		}
		sawDeadline <- time.Until(dl)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	kernrpc.Handle(srv, "Echo.Client", slow)
	kernrpc.Handle(srv, "Echo.Server", slow)
	kernrpc.Handle(srv, "Echo.Warm", func(context.Context, *echopb.Echo) (*echopb.Echo, error) { return &echopb.Echo{}, nil })
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	ccfg := *cfg
	ccfg.Filters = []kernrpc.FilterConfig{{Name: timeout.Name, Side: "client", Options: map[string]any{"default": "0s", "methods": map[string]any{"Echo.Client": "50ms"}}}}
	cli, err := kernrpc.NewClient(&ccfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	// Connected first: a dial under load must not eat the 50ms the call
	// has, which would end it before the handler ran.
	if err := cli.Call(context.Background(), "Echo.Warm", &echopb.Echo{}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	// saw is what the handler saw of the call's deadline; the handler
	// not running at all fails the test instead of hanging it.
	saw := func(err error) time.Duration {
		t.Helper()
		select {
		case left := <-sawDeadline:
			return left
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler never ran; the call ended with %v", err)
			return 0
		}
	}

	start := time.Now()
	err = cli.Call(context.Background(), "Echo.Client", &echopb.Echo{}, &echopb.Echo{})
	took := time.Since(start)
	left := saw(err)
	t.Logf("client filter, 50ms: the handler saw %v left; the call failed after %v with %v", left, took, err)
	if left <= 0 || left > 50*time.Millisecond {
		t.Errorf("the handler saw %v left, want the client filter's 50ms deadline", left)
	}
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), "timeout filter") || took > time.Second {
		t.Errorf("after %v: %v; want DeadlineExceeded naming the timeout filter, soon after 50ms", took, err)
	}

	start = time.Now()
	err = cli.Call(context.Background(), "Echo.Server", &echopb.Echo{}, &echopb.Echo{})
	took = time.Since(start)
	left = saw(err)
	t.Logf("server filter, 30ms: the handler saw %v left; the call failed after %v with %v", left, took, err)
	if left <= 0 || left > 30*time.Millisecond || kernel.CodeOf(err) != kernel.DeadlineExceeded || took > time.Second {
		t.Errorf("server filter: handler saw %v left, call ended after %v with %v; want the server's 30ms deadline", left, took, err)
	}
}
