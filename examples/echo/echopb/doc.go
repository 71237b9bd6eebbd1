// Package echopb is the echo service of examples/echo, described in
// echo.proto. echo.pb.go (protoc-gen-go), echo_kernrpc.pb.go and
// echo_vtproto.pb.go (protoc-gen-kernrpc) are generated from it and
// committed; flatbuffers.go, written by hand, lets the message speak
// FlatBuffers too.
package echopb
