// Package genpb is the benchmarks' echo service as protoc-gen-go and
// protoc-gen-kernrpc generate it from echo.proto: the message (echo.pb.go),
// its vtprotobuf fast-path methods (echo_vtproto.pb.go) and kernrpc's typed
// client and server (echo_kernrpc.pb.go), all committed. The systems
// "kernrpc generated" and "grpc-go generated" (../generated.go) call it
// through kernrpc's generated client and grpc-go's (grpcpb), with this
// message on both.
//
// To regenerate after editing a .proto, install protoc, protoc-gen-go at
// the version in go.mod, protoc-gen-kernrpc from this checkout and
// protoc-gen-go-grpc v1.5.1, with $(go env GOPATH)/bin on PATH:
//
//	apt-get install -y protobuf-compiler
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install ./cmd/protoc-gen-kernrpc   # from the repository root
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//
// then run `go generate ./benchmarks/genpb` from the repository root. The
// protos are compiled relative to benchmarks/, the module root, so that they
// register as genpb/echo.proto and genpb/grpcpb/echo.proto; the
// repository's TestCommittedCodeIsRegenerated (cmd/protoc-gen-kernrpc)
// regenerates the protoc-gen-kernrpc files the same way and fails if they
// differ, and TestGRPCCodeIsRegenerated here does it for grpcpb.
package genpb

//go:generate protoc --proto_path=.. --go_out=.. --go_opt=paths=source_relative --kernrpc_out=.. --kernrpc_opt=paths=source_relative genpb/echo.proto
//go:generate protoc --proto_path=.. --go_out=.. --go_opt=paths=source_relative --go-grpc_out=.. --go-grpc_opt=paths=source_relative genpb/grpcpb/echo.proto
