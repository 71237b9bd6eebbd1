// Package kernel is the microkernel of kernrpc: the interfaces every plugin
// implements (Transport, Codec, Registry, Balancer, Filter), the registry of
// plugins by name, the configuration that composes a service from plugin
// names, the frame format shared by transports, and the Server and Client
// that glue the plugins together.
//
// The kernel imports only the standard library and never a plugin. Plugins
// live in their own packages, register themselves from init under their
// config name, and are picked by name in a config file:
//
//	import _ "github.com/kernrpc/kernrpc/plugins/all"
//
//	cfg, _ := kernel.ParseConfig(tree, "kernrpc.yaml")
//	srv, _ := kernel.NewServer(cfg)
//	kernel.Handle(srv, "Echo.Say", func(ctx context.Context, req *pb.Msg) (*pb.Msg, error) { return req, nil })
//	srv.Serve(ctx)
package kernel
