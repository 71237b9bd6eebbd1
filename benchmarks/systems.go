package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// system is one RPC framework under test: how a child process serves echo
// with it, and how the harness calls that server. Each peer file (grpc.go,
// netrpc.go, kernrpc.go) registers one from init.
type system struct {
	name  string // as given to -systems and -serve: kernrpc, kernrpc-tuned, kernrpc-gen, grpc, grpc-gen, netrpc, ...
	label string // as shown in tables: kernrpc, kernrpc tuned, kernrpc generated, grpc-go, grpc-go generated, net/rpc, ...
	// serve starts an echo server listening on addr (host:port, port 0 for
	// any) and returns the address clients dial and a function that stops
	// the server. It runs in the child process.
	serve func(ctx context.Context, addr string, so serveOptions) (listening string, stop func(context.Context) error, err error)
	// dial makes one client to addr. Every caller of a round shares it, as
	// an application shares one grpc.ClientConn or one kernrpc client.
	dial func(ctx context.Context, addr string) (echoClient, error)
	// streams: the server also serves the stream mode's method, and the
	// clients dial makes are streamClients (stream.go).
	streams bool
}

// serveOptions are the harness flags that configure servers; the harness
// passes them on to its children.
type serveOptions struct {
	// aliasRequests turns on the protobuf codec's alias_requests on the
	// tuned kernrpc servers: requests are decoded in place, as the echo
	// handler allows. The default-path servers ignore it.
	aliasRequests bool
}

// echoClient is one framework client, shared by the callers of a round.
type echoClient interface {
	// newCaller returns a function that makes one echo call carrying
	// payload and returns the length of the payload that came back. Each
	// caller gets its own request and response messages, made here, so
	// that calling it allocates nothing beyond what the framework does.
	newCaller(payload []byte) callFunc
	Close() error
}

type callFunc func(ctx context.Context) (echoed int, err error)

// systemOrder is the order systems run in within a cell and appear in
// tables; kernrpc first (its default path, then tuned), then its peers.
var systemOrder = []string{
	"kernrpc", "kernrpc-1conn", "kernrpc-nohead", "kernrpc-tuned", "kernrpc-shm", "kernrpc-shm-tuned", "kernrpc-gen",
	"kernrpc-json", "kernrpc-msgpack", "kernrpc-flatbuffers",
	"grpc", "grpc-gen", "netrpc", "bare-tcp", "bare-tcp-pb", "bare-shm", "bare-shm-pb",
}

// peerSystems are the other frameworks, which every kernrpc system is
// compared with first.
var peerSystems = []string{"grpc", "netrpc"}

// defaultSystems are what a run compares unless -systems says otherwise:
// kernrpc on its default path and tuned, against its peers (shmring.go
// adds shm-ring on Linux), and the echo service through each one's
// generated code (generated.go). -codecs adds kernrpc with each other codec.
var defaultSystems = []string{"kernrpc", "kernrpc-tuned", "kernrpc-gen", "grpc", "grpc-gen", "netrpc"}

var systems = map[string]*system{}

func registerSystem(s *system) {
	if _, dup := systems[s.name]; dup || !slices.Contains(systemOrder, s.name) {
		panic("benchmarks: system " + s.name + " registered twice or missing from systemOrder")
	}
	systems[s.name] = s
}

// lookupSystems resolves a -systems list, keeping systemOrder so that rounds
// interleave and tables read the same way whatever order was typed.
func lookupSystems(names []string) ([]*system, error) {
	var out []*system
	for _, want := range systemOrder {
		if slices.Contains(names, want) {
			s, ok := systems[want]
			if !ok {
				return nil, fmt.Errorf("system %q is not built into this binary", want)
			}
			out = append(out, s)
		}
	}
	for _, n := range names {
		if !slices.Contains(systemOrder, n) {
			return nil, fmt.Errorf("unknown system %q in -systems; known: %s", n, strings.Join(systemOrder, ", "))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-systems is empty; give at least one of %s", strings.Join(systemOrder, ", "))
	}
	return out, nil
}
