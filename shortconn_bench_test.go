package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// BenchmarkShortCall is one short connection per op: a client of its own
// (NewClient with a static memory registry, as the harness's short mode
// makes it), one call, Close. It profiles what a connection's life costs,
// without a deadline, with a context that can be canceled (as the
// harness's callers and most servers' handlers have), and with a deadline
// client.timeout gives each call.
func BenchmarkShortCall(b *testing.B) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	srv := startServer(b, cfg, nil)
	cancelable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, bc := range []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
	}{
		{"no-deadline", context.Background(), 0},
		{"cancelable", cancelable, 0},
		{"client.timeout", context.Background(), 10 * time.Second},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ccfg := kernrpc.DefaultConfig()
			ccfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{"static": map[string]any{"echo": []any{srv.Addr()}}}}
			ccfg.Client.Timeout = kernel.Duration(bc.timeout)
			req, resp := &echopb.Echo{Text: "short"}, &echopb.Echo{}
			b.ReportAllocs()
			for b.Loop() {
				cli, err := kernrpc.NewClient(ccfg, "echo")
				if err != nil {
					b.Fatal(err)
				}
				if err := cli.Call(bc.ctx, "Echo.Echo", req, resp); err != nil {
					b.Fatal(err)
				}
				if err := cli.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNewClient is a client made and closed without a call: the
// part of a short connection that is the engine's own.
func BenchmarkNewClient(b *testing.B) {
	ccfg := kernrpc.DefaultConfig()
	ccfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{"static": map[string]any{"echo": []any{"127.0.0.1:1"}}}}
	b.ReportAllocs()
	for b.Loop() {
		cli, err := kernrpc.NewClient(ccfg, "echo")
		if err != nil {
			b.Fatal(err)
		}
		if err := cli.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
