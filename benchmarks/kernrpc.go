package main

import (
	"context"
	"fmt"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/plainpb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// The systems under test: kernrpc with its default plugins (tcp-lv
// transport, protobuf codec, round-robin balancer, one connection per
// instance, a second while large calls load it) and no filters, in two
// variants:
//
//   - kernrpc, the default path: what a new user gets. Messages generated
//     by protoc-gen-go alone (internal/plainpb), which the protobuf codec
//     marshals through protobuf-go's reflection, and no options at all.
//   - kernrpc tuned: messages with vtprotobuf's generated methods
//     (internal/echopb), which the codec uses instead (no reflection; a
//     reused reply keeps its payload's memory), and the server's codec
//     decoding requests in place (alias_requests, unless
//     -alias-requests=false), which the echo handler allows since it only
//     reads its request.
//
// The client finds the server through the memory registry's static list,
// so no registry traffic is measured. shmring.go adds the same over
// shm-ring, codecs.go the same with each other codec. kernrpc-1conn, not
// run by default, is the default path held to one connection per
// instance (client.max_pool_size 1): beside kernrpc in one run, it
// measures what spreading large calls over a second connection gains.
// kernrpc-nohead, not run by default either, is the default path with
// gc_headroom 0 on both sides: what the GC headroom kernrpc keeps while it
// moves large messages gains. Run it without the other kernrpc systems:
// once one of their clients has read a large answer, this process keeps
// the headroom for a while, and every client here runs with it.

func init() {
	registerKernRPC("kernrpc", "kernrpc", kernrpcVariant{codec: kernrpc.DefaultCodec})
	registerKernRPC("kernrpc-tuned", "kernrpc tuned", kernrpcVariant{codec: kernrpc.DefaultCodec, vt: true, tuned: true})
	registerKernRPC("kernrpc-1conn", "kernrpc 1 conn", kernrpcVariant{codec: kernrpc.DefaultCodec, oneConn: true})
	registerKernRPC("kernrpc-nohead", "kernrpc no GC headroom", kernrpcVariant{codec: kernrpc.DefaultCodec, noHeadroom: true})
}

// kernrpcService is the service name both sides agree on.
const kernrpcService = "echo"

// kernrpcVariant is one way of configuring kernrpc's echo on both sides.
type kernrpcVariant struct {
	transport string // "" for the default, tcp-lv
	codec     string
	// vt: the echopb message, with vtprotobuf's methods, instead of
	// plainpb's plain protoc-gen-go one.
	vt bool
	// tuned: the server applies the tuning flags (-alias-requests).
	tuned bool
	// oneConn: the client keeps to one connection per instance.
	oneConn bool
	// noHeadroom: gc_headroom 0 on both sides.
	noHeadroom bool
}

func registerKernRPC(name, label string, v kernrpcVariant) {
	registerSystem(&system{name: name, label: label, serve: v.serve, dial: v.dial, streams: true})
}

// config is the part of the configuration both sides share.
func (v kernrpcVariant) config() *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Codec.Name = v.codec
	if v.transport != "" {
		cfg.Transport.Name = v.transport
	}
	if v.noHeadroom {
		none := kernel.Size(0)
		cfg.GCHeadroom = &none
	}
	return cfg
}

// serve serves echo configured with the variant's codec. The server would
// answer any codec a client sends; configuring the one measured keeps it
// honest.
func (v kernrpcVariant) serve(ctx context.Context, addr string, so serveOptions) (string, func(context.Context) error, error) {
	cfg := v.config()
	cfg.Service = kernrpcService
	cfg.Address = addr
	cfg.Codec = v.serverCodec(so)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("kernrpc: new server: %w", err)
	}
	if v.vt {
		kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return req, nil
		})
		handleStream(srv, (*echopb.Echo).GetText, func(p []byte) *echopb.Echo { return &echopb.Echo{Payload: p} })
	} else {
		kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *plainpb.Echo) (*plainpb.Echo, error) {
			return req, nil
		})
		handleStream(srv, (*plainpb.Echo).GetText, func(p []byte) *plainpb.Echo { return &plainpb.Echo{Payload: p} })
	}
	if err := srv.Start(ctx); err != nil {
		return "", nil, fmt.Errorf("kernrpc: start: %w", err)
	}
	return srv.Addr(), srv.Shutdown, nil
}

// handleStream registers the stream mode's method with messages of type
// M: it sends what the request's text asks for, one message with a
// payload of the size asked, over and over.
func handleStream[M any](srv *kernrpc.Server, text func(*M) string, withPayload func([]byte) *M) {
	kernrpc.HandleServerStream(srv, streamMethod, func(_ context.Context, req *M, st kernrpc.ServerStreamOf[M, M]) error {
		size, count, err := parseStreamText(text(req))
		if err != nil {
			return kernel.Errorf(kernel.InvalidArgument, "%v", err)
		}
		msg := withPayload(make([]byte, size))
		return sendStream(count, func() error { return st.Send(msg) })
	})
}

// serverCodec is the codec config of a kernrpc echo server: alias_requests
// is a protobuf option (the other codecs' requests alias or copy by
// nature) that only the tuned variants take, and the echo handler keeps
// its contract: it only reads the request, and answers with it before
// returning.
func (v kernrpcVariant) serverCodec(so serveOptions) kernrpc.PluginConfig {
	pc := kernrpc.PluginConfig{Name: v.codec}
	if v.tuned && v.codec == protobuf.Name && so.aliasRequests {
		pc.Options = map[string]any{"alias_requests": true}
	}
	return pc
}

// dial makes a client that calls in the variant's codec and transport.
func (v kernrpcVariant) dial(_ context.Context, addr string) (echoClient, error) {
	cfg := v.config()
	if v.oneConn {
		cfg.Client.MaxPoolSize = 1
	}
	cfg.Registry = kernrpc.PluginConfig{
		Name:    "memory",
		Options: map[string]any{"static": map[string]any{kernrpcService: []any{addr}}},
	}
	cli, err := kernrpc.NewClient(cfg, kernrpcService)
	if err != nil {
		return nil, fmt.Errorf("kernrpc: new client for %s: %w", addr, err)
	}
	return kernrpcClient{c: cli, vt: v.vt}, nil
}

type kernrpcClient struct {
	c  *kernrpc.Client
	vt bool
}

func (c kernrpcClient) newCaller(payload []byte) callFunc {
	if c.vt {
		req, resp := &echopb.Echo{Payload: payload}, &echopb.Echo{}
		return func(ctx context.Context) (int, error) {
			err := c.c.Call(ctx, "Echo.Echo", req, resp)
			return len(resp.Payload), err
		}
	}
	req, resp := &plainpb.Echo{Payload: payload}, &plainpb.Echo{}
	return func(ctx context.Context) (int, error) {
		err := c.c.Call(ctx, "Echo.Echo", req, resp)
		return len(resp.Payload), err
	}
}

func (c kernrpcClient) Close() error { return c.c.Close() }

// openStream opens the stream mode's method. The default path reads as
// the typed API does, a new message per Recv; tuned decodes every message
// into one reused echopb.Echo, whose payload keeps its memory.
func (c kernrpcClient) openStream(ctx context.Context, size, count int) (msgStream, error) {
	text := streamText(size, count)
	if c.vt {
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, c.c, streamMethod, &echopb.Echo{Text: text})
		if err != nil {
			return nil, err
		}
		return &kernrpcTunedStream{st: st}, nil
	}
	st, err := kernrpc.OpenServerStream[plainpb.Echo, plainpb.Echo](ctx, c.c, streamMethod, &plainpb.Echo{Text: text})
	if err != nil {
		return nil, err
	}
	return kernrpcStream{st}, nil
}

type kernrpcStream struct {
	st kernrpc.ClientStreamOf[plainpb.Echo, plainpb.Echo]
}

func (s kernrpcStream) recv() (int, error) {
	m, err := s.st.Recv()
	if err != nil {
		return 0, err
	}
	return len(m.Payload), nil
}

func (s kernrpcStream) Close() error { return s.st.Close() }

type kernrpcTunedStream struct {
	st  kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]
	msg echopb.Echo
}

func (s *kernrpcTunedStream) recv() (int, error) {
	if err := s.st.RecvMsg(&s.msg); err != nil {
		return 0, err
	}
	return len(s.msg.Payload), nil
}

func (s *kernrpcTunedStream) Close() error { return s.st.Close() }
