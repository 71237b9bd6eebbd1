// Command customplugin runs an echo service whose config picks a plugin
// that is not part of kernrpc: the require-metadata filter of package
// requiremeta, written as a user outside the repository would write it. It
// makes one call that carries the metadata the filter requires and one that
// does not, prints both outcomes and exits.
//
//	go run ./examples/customplugin [-config examples/customplugin/kernrpc.yaml]
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/examples/customplugin/requiremeta" // its init registers "require-metadata"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

//go:embed kernrpc.yaml
var defaultConfig []byte

func main() {
	configPath := flag.String("config", "", "config file to use instead of the built-in copy of examples/customplugin/kernrpc.yaml")
	flag.Parse()
	// The example tells its own story on stdout; kernrpc's informational
	// logs would only interleave with it.
	slog.SetLogLoggerLevel(slog.LevelWarn)
	if err := run(*configPath, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "customplugin:", err)
		os.Exit(1)
	}
}

func run(configPath string, out io.Writer) error {
	var (
		cfg *kernrpc.Config
		err error
	)
	if configPath == "" {
		cfg, err = kernrpc.ParseConfig(defaultConfig, "examples/customplugin/kernrpc.yaml")
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
	kernrpc.Handle(srv, "Echo.Echo", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		tenant := kernrpc.IncomingMetadata(ctx)["tenant"]
		return wrapperspb.String("echo for " + tenant + ": " + req.GetValue()), nil
	})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	for _, f := range cfg.Filters {
		fmt.Fprintf(out, "filter:   %s on the %s side, options %v\n", f.Name, f.Side, f.Options)
	}

	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return err
	}
	defer cli.Close()

	// With the metadata the filter requires, the call reaches the handler.
	var resp wrapperspb.StringValue
	withTenant := kernrpc.WithMetadata(ctx, kernel.Metadata{"tenant": "acme"})
	if err := cli.Call(withTenant, "Echo.Echo", wrapperspb.String("hello"), &resp); err != nil {
		return fmt.Errorf("a call with a tenant: %w", err)
	}
	fmt.Fprintf(out, "passed:   %q\n", resp.GetValue())

	// Without it, the filter rejects the call before the handler runs.
	err = cli.Call(ctx, "Echo.Echo", wrapperspb.String("hello"), &resp)
	if err == nil {
		return fmt.Errorf("a call without a tenant succeeded; the require-metadata filter did not run")
	}
	if got, want := kernel.CodeOf(err).String(), rejectCode(cfg); got != want {
		return fmt.Errorf("a call without a tenant failed with %w, not with the filter's rejection code %s", err, want)
	}
	fmt.Fprintf(out, "rejected: %v\n", err)
	return nil
}

// rejectCode is the status code cfg tells the require-metadata filter to
// reject with.
func rejectCode(cfg *kernrpc.Config) string {
	for _, f := range cfg.Filters {
		if f.Name != requiremeta.Name {
			continue
		}
		if code, ok := f.Options["code"].(string); ok {
			return code
		}
		return requiremeta.DefaultOptions().Code.String()
	}
	return "(no require-metadata filter in the config)"
}
