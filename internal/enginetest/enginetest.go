// Package enginetest starts the engine's servers and clients for tests,
// so that each plugin's engine tests do not carry their own copy of the
// same setup: a config in a registry namespace of the test's own, a
// server started and shut down at cleanup, a client closed at cleanup.
// Only tests import it.
package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// Config is a config for the service "echo" on loopback, found through a
// memory registry namespace of the test's own, with calls bounded by 5 s.
func Config(t testing.TB) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": "enginetest/" + t.Name()}
	cfg.Client.Timeout = kernel.Duration(5 * time.Second)
	return cfg
}

// WithFilters returns a copy of cfg with filters in place of its own.
func WithFilters(cfg *kernrpc.Config, filters ...kernrpc.FilterConfig) *kernrpc.Config {
	c := *cfg
	c.Filters = filters
	return &c
}

// Serve builds a server from cfg, lets register add its methods, starts
// it, and shuts it down when the test ends.
func Serve(t testing.TB, cfg *kernrpc.Config, register func(*kernrpc.Server)) *kernrpc.Server {
	t.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	register(srv)
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}

// Dial builds a client of cfg's service and closes it when the test ends.
func Dial(t testing.TB, cfg *kernrpc.Config) *kernrpc.Client {
	t.Helper()
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
