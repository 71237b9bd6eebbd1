// Package grpcpb is the benchmarks' echo service as protoc-gen-go-grpc
// v1.5.1 generates it for grpc-go (echo_grpc.pb.go, committed), over the
// message of package genpb. It is a package of its own because
// protoc-gen-go-grpc and protoc-gen-kernrpc give a service's client and
// server the same Go names. ../doc.go says how to regenerate it.
package grpcpb
