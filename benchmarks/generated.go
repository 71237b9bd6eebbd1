package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/benchmarks/genpb"
	"github.com/kernrpc/kernrpc/benchmarks/genpb/grpcpb"
)

// The generated-code systems: the echo service of genpb/echo.proto, called
// and served only through what the code generators give a user, with
// default options on both sides.
//
//   - kernrpc generated: protoc-gen-kernrpc's typed client
//     (genpb.NewEchoServiceClient(cli).Echo(ctx, req)) and its
//     RegisterEchoServiceServer, over kernrpc's defaults (tcp-lv, the
//     protobuf codec, no options). genpb.Echo carries the vtprotobuf
//     methods protoc-gen-kernrpc generates beside it, which the codec uses;
//     the generated client returns a new reply per call, as grpc-go's does.
//   - grpc-go generated: protoc-gen-go-grpc's client
//     (grpcpb.NewEchoServiceClient(conn).Echo(ctx, req)) and
//     RegisterEchoServiceServer, default options, over the same genpb.Echo
//     (whose vtprotobuf methods grpc-go's codec does not use).
//
// Neither streams: the proto declares only the unary method, so both sit
// the stream mode out.

func init() {
	registerSystem(&system{name: "kernrpc-gen", label: "kernrpc generated", serve: serveKernRPCGenerated, dial: dialKernRPCGenerated})
	registerSystem(&system{name: "grpc-gen", label: "grpc-go generated", serve: serveGRPCGenerated, dial: dialGRPCGenerated})
}

// genEcho implements both generated server interfaces: it answers with the
// request, as every echo server of the harness does.
type genEcho struct {
	grpcpb.UnimplementedEchoServiceServer
}

func (genEcho) Echo(_ context.Context, req *genpb.Echo) (*genpb.Echo, error) { return req, nil }

var (
	_ genpb.EchoServiceServer  = genEcho{}
	_ grpcpb.EchoServiceServer = genEcho{}
)

// serveKernRPCGenerated serves genpb's EchoService through the generated
// register function, with the default configuration.
func serveKernRPCGenerated(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = kernrpcService
	cfg.Address = addr
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("kernrpc generated: new server: %w", err)
	}
	genpb.RegisterEchoServiceServer(srv, genEcho{})
	if err := srv.Start(ctx); err != nil {
		return "", nil, fmt.Errorf("kernrpc generated: start: %w", err)
	}
	return srv.Addr(), srv.Shutdown, nil
}

// dialKernRPCGenerated makes a default client, finding the server through
// the memory registry's static list as the other kernrpc systems do, and
// wraps it in the generated typed client.
func dialKernRPCGenerated(_ context.Context, addr string) (echoClient, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Registry = kernrpc.PluginConfig{
		Name:    "memory",
		Options: map[string]any{"static": map[string]any{kernrpcService: []any{addr}}},
	}
	cli, err := kernrpc.NewClient(cfg, kernrpcService)
	if err != nil {
		return nil, fmt.Errorf("kernrpc generated: new client for %s: %w", addr, err)
	}
	return kernrpcGenClient{c: cli, echo: genpb.NewEchoServiceClient(cli)}, nil
}

type kernrpcGenClient struct {
	c    *kernrpc.Client
	echo *genpb.EchoServiceClient
}

// newCaller calls as a user of the generated client does: the request
// made once, a new reply from every call.
func (c kernrpcGenClient) newCaller(payload []byte) callFunc {
	req := &genpb.Echo{Payload: payload}
	return func(ctx context.Context) (int, error) {
		resp, err := c.echo.Echo(ctx, req)
		return len(resp.GetPayload()), err
	}
}

func (c kernrpcGenClient) Close() error { return c.c.Close() }

// serveGRPCGenerated serves grpcpb's EchoService through the generated
// register function on a default grpc.Server.
func serveGRPCGenerated(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	return serveGRPCWith(ctx, addr, func(srv *grpc.Server) { grpcpb.RegisterEchoServiceServer(srv, genEcho{}) })
}

func dialGRPCGenerated(_ context.Context, addr string) (echoClient, error) {
	conn, err := newGRPCConn(addr)
	if err != nil {
		return nil, err
	}
	return grpcGenClient{conn: conn, echo: grpcpb.NewEchoServiceClient(conn)}, nil
}

type grpcGenClient struct {
	conn *grpc.ClientConn
	echo grpcpb.EchoServiceClient
}

// newCaller calls as a user of grpc-go's generated client does, as
// kernrpcGenClient's does.
func (c grpcGenClient) newCaller(payload []byte) callFunc {
	req := &genpb.Echo{Payload: payload}
	return func(ctx context.Context) (int, error) {
		resp, err := c.echo.Echo(ctx, req)
		return len(resp.GetPayload()), err
	}
}

func (c grpcGenClient) Close() error { return c.conn.Close() }

// generatedNote is the results header's line on the generated-code systems.
const generatedNote = "- Generated code: **kernrpc generated** calls `genpb.NewEchoServiceClient(cli).Echo(ctx, req)`, protoc-gen-kernrpc's " +
	"typed client (a new reply per call), against a server registered with the generated `genpb.RegisterEchoServiceServer`, " +
	"default options on both sides (tcp-lv, protobuf codec); `genpb.Echo` has the vtprotobuf methods protoc-gen-kernrpc " +
	"generates beside it, which kernrpc's codec uses. **grpc-go generated** calls protoc-gen-go-grpc v1.5.1's " +
	"`grpcpb.NewEchoServiceClient(conn).Echo(ctx, req)` against `grpcpb.RegisterEchoServiceServer`, default options, the same " +
	"`genpb.Echo` (grpc-go's codec marshals it through protobuf-go). Both sit the stream mode out.\n"

// generatedTargets are issue 17's goals for the generated code, over
// tcp-lv with default options: calls/s of kernrpc's generated client
// against grpc-go's in two long-mode cells.
var generatedTargets = []struct {
	payload, callers int
	min              float64
}{
	{64 << 10, 1, 5},
	{16, 64, 4},
}

// generatedTargets writes, for the targets whose cells ran with both
// generated systems, the ratio of their calls/s and whether it met its
// goal.
func (b *benchmark) generatedTargets(w *strings.Builder) {
	k, g := b.systemIndex("kernrpc-gen"), b.systemIndex("grpc-gen")
	if k < 0 || g < 0 {
		return
	}
	var lines []string
	for _, tg := range generatedTargets {
		c := cell{mode: modeLong, payload: tg.payload, callers: tg.callers}
		rs := b.results[c]
		if rs == nil || rs[k] == nil || rs[g] == nil {
			continue
		}
		got := rs[k].qps() / rs[g].qps()
		verdict := "met"
		if got < tg.min {
			verdict = "**not met**"
		}
		floor := ""
		if tg.callers == 1 {
			// One caller is one connection for the floor too.
			floor = b.floorNote(c, "bare-tcp", g)
		}
		lines = append(lines, fmt.Sprintf("- kernrpc generated / grpc-go generated, calls/s at %s and %d %s: %.2f× (target ≥ %.0f×): %s%s\n",
			sizeName(tg.payload), tg.callers, plural(tg.callers, "caller"), got, tg.min, verdict, floor))
	}
	if len(lines) > 0 {
		w.WriteString("Targets, generated code over tcp-lv with default options against grpc-go's:\n\n" + strings.Join(lines, "") + "\n")
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
