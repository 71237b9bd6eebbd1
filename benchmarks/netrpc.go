package main

import (
	"context"
	"fmt"
	"net"
	"net/rpc"
)

// The net/rpc peer: the standard library's RPC package with its default gob
// codec over one TCP connection, which rpc.Client multiplexes for all
// callers. It is the floor a Go RPC framework should beat: no protobuf, no
// HTTP/2, a reader goroutine and a mutex-guarded writer.

func init() {
	registerSystem(&system{name: "netrpc", label: "net/rpc", serve: serveNetRPC, dial: dialNetRPC})
}

// EchoArgs and EchoReply are net/rpc's request and response; gob needs
// exported types.
type EchoArgs struct{ Payload []byte }
type EchoReply struct{ Payload []byte }

// EchoService is registered under the name "Echo", so its method is called
// as "Echo.Echo", the same name kernrpc uses.
type EchoService struct{}

// Echo sends the payload back.
func (EchoService) Echo(args *EchoArgs, reply *EchoReply) error {
	reply.Payload = args.Payload
	return nil
}

func serveNetRPC(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	srv := rpc.NewServer()
	if err := srv.RegisterName("Echo", EchoService{}); err != nil {
		return "", nil, fmt.Errorf("net/rpc: register: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("net/rpc: listen %s: %w", addr, err)
	}
	// srv.Accept would log the listener's closing at shutdown as an error.
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(conn)
		}
	}()
	// net/rpc cannot drain connections; closing the listener and exiting
	// the process is its shutdown.
	stop := func(context.Context) error { return ln.Close() }
	return ln.Addr().String(), stop, nil
}

func dialNetRPC(ctx context.Context, addr string) (echoClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("net/rpc: dial %s: %w", addr, err)
	}
	return netRPCClient{rpc.NewClient(conn)}, nil
}

type netRPCClient struct{ c *rpc.Client }

func (c netRPCClient) newCaller(payload []byte) callFunc {
	args := &EchoArgs{Payload: payload}
	reply := &EchoReply{}
	return func(context.Context) (int, error) {
		// Start from an empty reply, as proto.Unmarshal does for the other
		// peers: gob would otherwise decode into the previous payload's
		// memory and look cheaper than an application that reads replies.
		// net/rpc's Call takes no context; rounds end by a flag instead.
		reply.Payload = nil
		err := c.c.Call("Echo.Echo", args, reply)
		return len(reply.Payload), err
	}
}

func (c netRPCClient) Close() error { return c.c.Close() }
