package main

import (
	"context"
	"fmt"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// The system under test: kernrpc with its default plugins (tcp-lv
// transport, protobuf codec, round-robin balancer, one connection per
// instance) and no filters; -alias-requests (on unless turned off) sets
// the one non-default option, on the server's codec. The client finds the
// server through the memory registry's static list, so no registry traffic
// is measured. codecs.go adds the same with each other codec.

func init() {
	registerSystem(&system{name: "kernrpc", label: "kernrpc",
		serve: serveKernRPC(kernrpc.DefaultCodec), dial: dialKernRPC(kernrpc.DefaultCodec)})
}

// kernrpcService is the service name both sides agree on.
const kernrpcService = "echo"

// serveKernRPC serves echo configured with codec. The server would answer
// any codec a client sends; configuring the one measured keeps it honest.
func serveKernRPC(codec string) func(ctx context.Context, addr string, so serveOptions) (string, func(context.Context) error, error) {
	return func(ctx context.Context, addr string, so serveOptions) (string, func(context.Context) error, error) {
		cfg := kernrpc.DefaultConfig()
		cfg.Service = kernrpcService
		cfg.Address = addr
		cfg.Codec = serverCodec(codec, so)
		srv, err := kernrpc.NewServer(cfg)
		if err != nil {
			return "", nil, fmt.Errorf("kernrpc: new server: %w", err)
		}
		kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return req, nil
		})
		if err := srv.Start(ctx); err != nil {
			return "", nil, fmt.Errorf("kernrpc: start: %w", err)
		}
		return srv.Addr(), srv.Shutdown, nil
	}
}

// serverCodec is the codec config of a kernrpc echo server: alias_requests
// is a protobuf option (the other codecs' requests alias or copy by
// nature), and the echo handler keeps its contract: it only reads the
// request, and answers with it before returning.
func serverCodec(codec string, so serveOptions) kernrpc.PluginConfig {
	pc := kernrpc.PluginConfig{Name: codec}
	if codec == protobuf.Name && so.aliasRequests {
		pc.Options = map[string]any{"alias_requests": true}
	}
	return pc
}

// dialKernRPC makes a client that calls in codec.
func dialKernRPC(codec string) func(ctx context.Context, addr string) (echoClient, error) {
	return func(_ context.Context, addr string) (echoClient, error) {
		cfg := kernrpc.DefaultConfig()
		cfg.Codec.Name = codec
		cfg.Registry = kernrpc.PluginConfig{
			Name:    "memory",
			Options: map[string]any{"static": map[string]any{kernrpcService: []any{addr}}},
		}
		cli, err := kernrpc.NewClient(cfg, kernrpcService)
		if err != nil {
			return nil, fmt.Errorf("kernrpc: new client for %s: %w", addr, err)
		}
		return kernrpcClient{cli}, nil
	}
}

type kernrpcClient struct{ c *kernrpc.Client }

func (c kernrpcClient) newCaller(payload []byte) callFunc {
	req := &echopb.Echo{Payload: payload}
	resp := &echopb.Echo{}
	return func(ctx context.Context) (int, error) {
		err := c.c.Call(ctx, "Echo.Echo", req, resp)
		return len(resp.Payload), err
	}
}

func (c kernrpcClient) Close() error { return c.c.Close() }
