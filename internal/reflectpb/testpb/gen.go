// Package testpb holds a service with a method of each kind
// (kernrpc.reflecttest.v1.Notes, service.proto) whose messages are in a
// file it imports (types.proto, which imports a well-known type): the
// reflection service's, the generic package's and the command line's tests
// use it. Not for use outside tests.
//
// The .pb.go files are generated and committed; testdata/notes.protoset is
// the same files as a descriptor set (protoc --descriptor_set_out
// --include_imports), and testdata/gateway.protoset that of
// testdata/gateway.proto, a service no Go code is generated for.
// Regenerate them with `go generate ./internal/reflectpb/testpb` from the
// module root (see internal/reflectpb/gen.go for the tools).
package testpb

//go:generate protoc --proto_path=../../.. --go_out=../../.. --go_opt=paths=source_relative internal/reflectpb/testpb/types.proto internal/reflectpb/testpb/service.proto
//go:generate protoc --proto_path=../../.. --include_imports --descriptor_set_out=testdata/notes.protoset internal/reflectpb/testpb/service.proto
//go:generate protoc --proto_path=testdata --include_imports --descriptor_set_out=testdata/gateway.protoset testdata/gateway.proto
