// Package generic calls and serves kernrpc methods without generated code,
// from their protobuf descriptors: for command-line tools, gateways and
// proxies (docs/reflection.md).
//
// Descriptors come from a Source: a server's reflection service
// (NewReflectionSource; the server runs with server.reflection: true) or a
// descriptor set file (LoadDescriptorSet, for what `protoc
// --descriptor_set_out=FILE --include_imports` writes).
//
// A Client calls any method by its kernrpc name ("pkg.Service.Method")
// with a *dynamicpb.Message (Call) or a request in JSON (CallJSON, through
// protojson), and reads server streams (ServerStream, ServerStreamJSON) or
// opens any stream (OpenStream). Register and RegisterStream serve a
// method on a kernrpc.Server from its protoreflect.MethodDescriptor, with
// handlers taking and returning *dynamicpb.Message, and give its file to
// the server's reflection service.
//
// Dynamic messages are encoded through protobuf's reflection, which the
// protobuf and json codecs use; msgpack and flatbuffers need generated
// types.
package generic
