// Command echo starts an echo server and a client in one process, composed
// from kernrpc.yaml, makes calls in all three call models through the
// client generated from echopb/echo.proto, then one call in each built-in
// codec (the server answers every call in the codec the client used),
// prints them and exits. Changing the codec line of kernrpc.yaml switches
// both sides to another codec.
//
//	go run ./examples/echo [-config examples/echo/kernrpc.yaml]
package main

// With protoc, protoc-gen-go and protoc-gen-kernrpc on PATH (docs/codegen.md):
//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --kernrpc_out=. --kernrpc_opt=paths=source_relative echopb/echo.proto

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/examples/echo/echopb"
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
	if err := run(os.Stdout, *configPath); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

// echoServer implements echopb.EchoServiceServer. echopb.Echo speaks every
// built-in codec, so one handler serves them all. With flatbuffers,
// req.Payload points into the received bytes: it may go into the answer,
// but must be copied to outlive the call.
type echoServer struct{}

func (echoServer) Say(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
	return &echopb.Echo{Text: "echo: " + req.Text + " (" + kernrpc.CallInfoFrom(ctx).Codec + ")", Payload: req.Payload}, nil
}

func run(out io.Writer, configPath string) error {
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
	echopb.RegisterEchoServiceServer(srv, echoServer{})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(out, "server: %s on %s (transport %s, codec %s, registry %s)\n",
		cfg.Service, srv.Addr(), cfg.Transport.Name, cfg.Codec.Name, cfg.Registry.Name)

	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return err
	}
	defer cli.Close()
	echo := echopb.NewEchoServiceClient(cli)

	// 1. Synchronous: Say blocks until the answer is decoded.
	start := time.Now()
	resp, err := echo.Say(ctx, &echopb.Echo{Text: "hello, sync"})
	if err != nil {
		return fmt.Errorf("sync call: %w", err)
	}
	fmt.Fprintf(out, "sync:     %q in %s\n", resp.Text, time.Since(start).Round(time.Microsecond))

	// 2. Asynchronous: SayAsync returns at once; the call arrives on Done.
	call := <-echo.SayAsync(ctx, &echopb.Echo{Text: "hello, async"}, nil).Done
	if call.Err != nil {
		return fmt.Errorf("async call: %w", call.Err)
	}
	fmt.Fprintf(out, "async:    %q\n", call.Response.(*echopb.Echo).Text)

	// 3. Callback: the function runs with the answer or the error.
	finished := make(chan error, 1)
	echo.SayFunc(ctx, &echopb.Echo{Text: "hello, callback"}, func(resp *echopb.Echo, err error) {
		if err == nil {
			fmt.Fprintf(out, "callback: %q\n", resp.Text)
		}
		finished <- err
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
		r, err := echopb.NewEchoServiceClient(c).Say(ctx, &echopb.Echo{Text: "hello in " + codec})
		c.Close()
		if err != nil {
			return fmt.Errorf("call in %s: %w", codec, err)
		}
		fmt.Fprintf(out, "%-12s %q\n", codec+":", r.Text)
	}

	// A status error travels back with its code: here for a method the
	// server does not serve, called by name.
	err = cli.Call(ctx, echopb.EchoService_ServiceName+".Shout", &echopb.Echo{}, new(echopb.Echo))
	fmt.Fprintf(out, "status:   %v (code %s)\n", err, kernel.CodeOf(err))
	if kernel.CodeOf(err) != kernel.Unimplemented {
		return fmt.Errorf("calling a missing method gave %v, want Unimplemented", err)
	}
	fmt.Fprintln(out, "ok")
	return nil
}
