package accesslog_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/accesslog"
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
