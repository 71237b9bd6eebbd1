// Command echo starts an echo server and a client in one process, composed
// from kernrpc.yaml, makes calls in all three call models, then one call in
// each built-in codec (the server answers every call in the codec the
// client used), prints them and exits. Changing the codec line of
// kernrpc.yaml switches both sides to another codec.
//
//	go run ./examples/echo [-config examples/echo/kernrpc.yaml]
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

//go:embed kernrpc.yaml
var defaultConfig []byte

func main() {
	configPath := flag.String("config", "", "config file to use instead of the built-in copy of examples/echo/kernrpc.yaml")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/echo [-config FILE]\n\nStarts an echo server and a client in one process, calls it in all three call models, and exits.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	// The example tells its own story on stdout; kernrpc's informational
	// logs (serving, draining) would only interleave with it.
	slog.SetLogLoggerLevel(slog.LevelWarn)
	if err := run(*configPath); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func run(configPath string) error {
	var (
		cfg *kernrpc.Config
		err error
	)
	if configPath == "" {
		cfg, err = kernrpc.ParseConfig(defaultConfig, "examples/echo/kernrpc.yaml")
	} else {
		cfg, err = kernrpc.LoadConfig(configPath)
	}
	if err != nil {
		return err
	}
	ctx := context.Background()

	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return err
	}
	// echopb.Echo speaks every built-in codec, so one handler serves them
	// all. With flatbuffers, req.Payload points into the received bytes: it
	// may go into the answer, but must be copied to outlive the call.
	kernrpc.Handle(srv, "Echo.Echo", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
		return &echopb.Echo{Text: "echo: " + req.Text + " (" + kernrpc.CallInfoFrom(ctx).Codec + ")", Payload: req.Payload}, nil
	})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Printf("server: %s on %s (transport %s, codec %s, registry %s)\n",
		cfg.Service, srv.Addr(), cfg.Transport.Name, cfg.Codec.Name, cfg.Registry.Name)

	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return err
	}
	defer cli.Close()

	// 1. Synchronous: Call blocks until the answer is decoded into resp.
	var resp echopb.Echo
	start := time.Now()
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "hello, sync"}, &resp); err != nil {
		return fmt.Errorf("sync call: %w", err)
	}
	fmt.Printf("sync:     %q in %s\n", resp.Text, time.Since(start).Round(time.Microsecond))

	// 2. Asynchronous: Go returns at once; the call arrives on Done.
	var asyncResp echopb.Echo
	call := cli.Go(ctx, "Echo.Echo", &echopb.Echo{Text: "hello, async"}, &asyncResp, nil)
	done := <-call.Done
	if done.Err != nil {
		return fmt.Errorf("async call: %w", done.Err)
	}
	fmt.Printf("async:    %q\n", asyncResp.Text)

	// 3. Callback: the function runs with the finished call.
	finished := make(chan error, 1)
	var cbResp echopb.Echo
	cli.CallFunc(ctx, "Echo.Echo", &echopb.Echo{Text: "hello, callback"}, &cbResp, func(c *kernrpc.Call) {
		if c.Err == nil {
			fmt.Printf("callback: %q\n", c.Response.(*echopb.Echo).Text)
		}
		finished <- c.Err
	})
	if err := <-finished; err != nil {
		return fmt.Errorf("callback call: %w", err)
	}

	// 4. Any codec: the codec's name travels with each call, and the server
	// answers in it, whatever its own config says.
	for _, codec := range []string{"protobuf", "json", "msgpack", "flatbuffers"} {
		ccfg := *cfg
		ccfg.Codec = kernrpc.PluginConfig{Name: codec}
		c, err := kernrpc.NewClient(&ccfg, cfg.Service)
		if err != nil {
			return err
		}
		var r echopb.Echo
		err = c.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "hello in " + codec}, &r)
		c.Close()
		if err != nil {
			return fmt.Errorf("call in %s: %w", codec, err)
		}
		fmt.Printf("%-12s %q\n", codec+":", r.Text)
	}

	// A status error travels back with its code.
	err = cli.Call(ctx, "Echo.Missing", &echopb.Echo{}, &resp)
	fmt.Printf("status:   %v (code %s)\n", err, kernel.CodeOf(err))
	if kernel.CodeOf(err) != kernel.Unimplemented {
		return fmt.Errorf("calling a missing method gave %v, want Unimplemented", err)
	}
	fmt.Println("ok")
	return nil
}
