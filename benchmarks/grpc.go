package main

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kernrpc/kernrpc/internal/echopb"
)

// The grpc-go peer: unary calls over one grpc.ClientConn (one HTTP/2
// connection) with grpc's default proto codec and default options, which
// is how most Go services call each other.

func init() {
	registerSystem(&system{name: "grpc", label: "grpc-go", serve: serveGRPC, dial: dialGRPC})
}

// grpcEchoMethod is the full method name of EchoService.Echo as declared in
// internal/echopb/echo.proto (package kernrpc.echo).
const grpcEchoMethod = "/kernrpc.echo.EchoService/Echo"

// echoServiceServer is what protoc-gen-go-grpc would generate; echopb holds
// only the message, so the service description is written out here.
type echoServiceServer interface {
	Echo(context.Context, *echopb.Echo) (*echopb.Echo, error)
}

var echoServiceDesc = grpc.ServiceDesc{
	ServiceName: "kernrpc.echo.EchoService",
	HandlerType: (*echoServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Echo", Handler: echoHandler}},
	Metadata:    "internal/echopb/echo.proto",
}

// echoHandler is the generated-code shape of a unary handler: decode, then
// call the service directly or through the interceptor.
func echoHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(echopb.Echo)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(echoServiceServer).Echo(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcEchoMethod}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(echoServiceServer).Echo(ctx, req.(*echopb.Echo))
	})
}

type grpcEcho struct{}

func (grpcEcho) Echo(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil }

func serveGRPC(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("grpc: listen %s: %w", addr, err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&echoServiceDesc, grpcEcho{})
	go srv.Serve(ln) // returns when srv stops
	stop := func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			srv.Stop()
		}
		return nil
	}
	return ln.Addr().String(), stop, nil
}

func dialGRPC(_ context.Context, addr string) (echoClient, error) {
	// passthrough: the address is already an IP:port; skip the resolver.
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("grpc: client for %s: %w", addr, err)
	}
	return grpcClient{conn}, nil
}

type grpcClient struct{ conn *grpc.ClientConn }

func (c grpcClient) newCaller(payload []byte) callFunc {
	req := &echopb.Echo{Payload: payload}
	resp := &echopb.Echo{}
	return func(ctx context.Context) (int, error) {
		err := c.conn.Invoke(ctx, grpcEchoMethod, req, resp)
		return len(resp.Payload), err
	}
}

func (c grpcClient) Close() error { return c.conn.Close() }
