package accesslog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/accesslog"
	"github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, accesslog.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"sample": 0.5},
		BadOptions:    map[string]any{"sample": -1},
		BadOptionsKey: "sample",
	})
}

// Over the engine: the client's and the server's filter each log the call
// once, with what each side knows. The log filter logs through
// slog.Default() when built from a config, so the test swaps it.
func TestOverTheEngine(t *testing.T) {
	out := enginetest.DefaultLog(t)

	cfg := enginetest.WithFilters(enginetest.Config(t), kernrpc.FilterConfig{Name: accesslog.Name}) // both sides
	srv := enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			if req.Text == "fail" {
				return nil, kernel.Errorf(kernel.FailedPrecondition, "not now")
			}
			return req, nil
		})
	})
	cli := enginetest.Dial(t, cfg)

	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hello"}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	_ = cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "fail"}, &echopb.Echo{})
	var calls []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "msg=call") {
			calls = append(calls, l)
			t.Log(l)
		}
	}
	if len(calls) != 4 {
		t.Fatalf("%d call lines, want 4 (two calls, each logged on both sides)", len(calls))
	}
	want := []string{
		"level=INFO msg=call side=server method=Echo.Echo peer=127.0.0.1:",
		"level=INFO msg=call side=client method=Echo.Echo peer=" + srv.Addr() + " attempt=1 code=OK",
		"level=WARN msg=call side=server method=Echo.Echo peer=127.0.0.1:",
		"level=WARN msg=call side=client method=Echo.Echo peer=" + srv.Addr() + " attempt=1 code=FailedPrecondition",
	}
	for i, w := range want {
		if !strings.Contains(calls[i], w) {
			t.Errorf("line %d %q does not say %q", i, calls[i], w)
		}
	}
	for i, w := range []string{"req_bytes=7 resp_bytes=7", "req_bytes=7 resp_bytes=7", `req_bytes=6 err="not now"`, `req_bytes=6 err="not now"`} {
		if !strings.Contains(calls[i], w) {
			t.Errorf("line %d %q does not say %q", i, calls[i], w)
		}
	}
}

// A call the server refuses before its filters' Invoke runs (an Admitter:
// here a token bucket that has no token left) failed like any other, and
// gets its line too, though the log filter's Invoke never saw it.
func TestCallsRefusedBeforeTheFiltersAreLogged(t *testing.T) {
	out := enginetest.DefaultLog(t)
	cfg := enginetest.WithFilters(enginetest.Config(t),
		kernrpc.FilterConfig{Name: accesslog.Name, Side: "server"},
		kernrpc.FilterConfig{Name: tokenbucket.Name, Side: "server", Options: map[string]any{"rate": 0.001, "burst": 1}})
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil })
	})
	cli := enginetest.Dial(t, cfg)
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hello"}, &echopb.Echo{}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "hello"}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("second call: %v, want the token bucket's ResourceExhausted", err)
	}
	// The refused call's line is written once its answer is (CallEnded),
	// which may be just after the client read it.
	var calls []string
	for deadline := time.Now().Add(5 * time.Second); len(calls) < 2 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		calls = calls[:0]
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, "msg=call") {
				calls = append(calls, l)
			}
		}
	}
	if len(calls) != 2 {
		t.Fatalf("%d call lines, want 2: the call served and the one refused", len(calls))
	}
	for _, w := range []string{"level=WARN msg=call side=server method=Echo.Echo peer=127.0.0.1:", "code=ResourceExhausted", `err="token-bucket: Echo.Echo is over its rate limit`} {
		if !strings.Contains(calls[1], w) {
			t.Errorf("the refused call's line %q does not say %q", calls[1], w)
		}
	}
}
