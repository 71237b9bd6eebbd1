package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

// kernrpc over the shm-ring transport: kernrpc.go's echo service and
// client with the transport swapped, the server in its child process on
// the same host, the two attached through shared memory. The child is
// given a host:port address with port 0, which shm-ring turns into a fresh
// abstract socket name, as TCP picks a free port. It runs by default on
// Linux, the only system shm-ring supports.

func init() {
	registerSystem(&system{name: "kernrpc-shm", label: "kernrpc/shm-ring", serve: serveShmRing, dial: dialShmRing})
	if runtime.GOOS == "linux" {
		i := slices.Index(defaultSystems, "kernrpc") + 1
		defaultSystems = slices.Insert(defaultSystems, i, "kernrpc-shm")
	}
}

func serveShmRing(ctx context.Context, addr string, so serveOptions) (string, func(context.Context) error, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = kernrpcService
	cfg.Address = addr
	cfg.Transport.Name = shmring.Name
	cfg.Codec = serverCodec(kernrpc.DefaultCodec, so)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("kernrpc over shm-ring: new server: %w", err)
	}
	kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		return req, nil
	})
	if err := srv.Start(ctx); err != nil {
		return "", nil, fmt.Errorf("kernrpc over shm-ring: start: %w", err)
	}
	return srv.Addr(), srv.Shutdown, nil
}

func dialShmRing(_ context.Context, addr string) (echoClient, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Transport.Name = shmring.Name
	cfg.Registry = kernrpc.PluginConfig{
		Name:    "memory",
		Options: map[string]any{"static": map[string]any{kernrpcService: []any{addr}}},
	}
	cli, err := kernrpc.NewClient(cfg, kernrpcService)
	if err != nil {
		return nil, fmt.Errorf("kernrpc over shm-ring: new client for %s: %w", addr, err)
	}
	return kernrpcClient{cli}, nil
}
