// Package kernel is the contract of kernrpc: the interfaces every plugin
// implements (Transport, Codec, Registry, Balancer, Filter) and their
// optional interfaces, the plugin table with its factories, options
// decoding, the frame format transports carry, status codes, metadata and
// the CallInfo filters see.
//
// It imports only the standard library and never a plugin or the engine.
// Plugin authors read this package; users who build services import the
// engine, package github.com/kernrpc/kernrpc, which composes plugins from
// a config file. A plugin registers its Factory from init under its config
// name:
//
//	const Name = "my-codec"
//
//	var Factory = kernel.NewFactory(Name, "what it does", defaultOptions, build)
//
//	func init() { kernel.RegisterCodec(Factory) }
package kernel
