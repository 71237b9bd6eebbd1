package kernrpc

// The plugins a config falls back to when it leaves a kind out are built
// in, as grpc-go builds in its default codec, balancer and resolver: a
// program that imports only the engine runs on tcp-lv, protobuf, memory
// and round-robin. Every other plugin is imported by the program that
// uses it (or plugins/all, for every built-in one).
import (
	_ "github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
	_ "github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	_ "github.com/kernrpc/kernrpc/plugins/registry/memory"
	_ "github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// Default plugin names, used when a config leaves a kind out.
const (
	DefaultTransport = "tcp-lv"
	DefaultCodec     = "protobuf"
	DefaultRegistry  = "memory"
	DefaultBalancer  = "round-robin"
)
