// Package kernrpc is the engine users import to build services: it reads
// a config that names plugins, builds them, and runs a Server and a
// Client on them. The plugin contract (interfaces, plugin table, frames,
// status codes, metadata) is package kernel; the plugins are under
// plugins/ and register themselves when imported. The defaults a config
// falls back to (tcp-lv, protobuf, memory, round-robin) are built in;
// plugins/all imports every built-in plugin.
//
//	cfg, err := kernrpc.LoadConfig("kernrpc.yaml")
//	srv, err := kernrpc.NewServer(cfg)
//	kernrpc.Handle(srv, "Echo.Say", say)
//	err = srv.Start(ctx)                      // or Serve(ctx), which blocks
//	cli, err := kernrpc.NewClient(cfg, "echo")
//	err = cli.Call(ctx, "Echo.Say", req, &resp)
//
// On the client, call filters run before the pick and attempt filters
// after it, once per attempt; see docs/architecture.md.
package kernrpc
