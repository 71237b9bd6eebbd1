// Package reflectpb holds the messages of kernrpc's server reflection
// service, kernrpc.reflection.v1.Reflection (reflection.proto), which a
// server serves when server.reflection is on and which the generic package
// and the kernrpc command line ask.
//
// reflection.pb.go is generated and committed. To regenerate it after
// editing reflection.proto, install protoc and the Go plugin matching the
// version in go.mod, with $(go env GOPATH)/bin on PATH:
//
//	apt-get install -y protobuf-compiler   # or any protoc release >= 3.12
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//
// then run `go generate ./internal/reflectpb` from the module root. The
// proto is compiled relative to the module root so that it registers as
// "internal/reflectpb/reflection.proto".
package reflectpb

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative internal/reflectpb/reflection.proto
