package main

// target is one fuzz function and the package it lives in, as go test
// names it from the repository root.
type target struct {
	Name string // FuzzDecodeFrame
	Pkg  string // ./kernel
}

// targets lists every func Fuzz in the repository, in the order they run:
// the wire first (what a peer controls), then codecs, then what a caller,
// a registry or a person supplies: a token, descriptor sets and JSON for
// generic calls, registry records, plugin options, the config.
// TestTargetsAreEveryFuzzFunction fails while one is missing here.
var targets = []target{
	{"FuzzDecodeFrame", "./kernel"},
	{"FuzzDecodeMetadata", "./kernel"},
	{"FuzzDecodeMetadataLimits", "./kernel"},
	{"FuzzReadFrameLength", "./kernel"},
	{"FuzzReadFrame", "./plugins/transport/tcplv"},
	{"FuzzSharedMemory", "./plugins/transport/shmring"},
	{"FuzzRecordSequence", "./plugins/transport/shmring"},
	{"FuzzParseMessage", "./plugins/transport/shmring"},
	{"FuzzStreamFrames", "."},
	{"FuzzUnmarshal", "./plugins/codec/protobuf"},
	{"FuzzUnmarshalNested", "./plugins/codec/protobuf"},
	{"FuzzUnmarshal", "./plugins/codec/json"},
	{"FuzzUnmarshal", "./plugins/codec/msgpack"},
	{"FuzzUnmarshal", "./plugins/codec/flatbuffers"},
	{"FuzzAdmit", "./plugins/filter/auth"},
	{"FuzzParseDescriptorSet", "./generic"},
	{"FuzzUnmarshalJSON", "./generic"},
	{"FuzzDecodeInstance", "./plugins/registry/etcd"},
	{"FuzzDecodeEntry", "./plugins/registry/consul"},
	{"FuzzDecodeShared", "./plugins/registry/consul"},
	{"FuzzDecodeOptions", "./kernel"},
	{"FuzzParseConfig", "."},
}
