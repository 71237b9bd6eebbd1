// Command minimal is a kernrpc service and client that import nothing but
// the engine: a config that leaves out the transport, codec, registry and
// balancer runs on the defaults the engine builds in (tcp-lv, protobuf,
// memory, round-robin). Any other plugin is one import away, as
// examples/echo shows with plugins/all.
//
//	go run ./examples/minimal
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/minimal\n\nServes Greeter.Hello on the built-in defaults, calls it once and exits.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	slog.SetLogLoggerLevel(slog.LevelWarn)
	answer, err := run(context.Background(), "world")
	if err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
	fmt.Println(answer)
}

func run(ctx context.Context, name string) (string, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "greeter"
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return "", err
	}
	kernrpc.Handle(srv, "Greeter.Hello", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("hello, " + req.GetValue()), nil
	})
	if err := srv.Start(ctx); err != nil {
		return "", err
	}
	defer srv.Shutdown(ctx)
	cli, err := kernrpc.NewClient(cfg, "greeter")
	if err != nil {
		return "", err
	}
	defer cli.Close()
	var resp wrapperspb.StringValue
	if err := cli.Call(ctx, "Greeter.Hello", wrapperspb.String(name), &resp); err != nil {
		return "", err
	}
	return resp.GetValue(), nil
}
