// Command kernrpc serves a kernrpc service composed from a config file,
// calls and health-checks services, and lists the plugins compiled into
// it: every built-in plugin, including those with modules of their own
// (etcd, consul, prometheus, otel-tracing). It is a module of its own for
// that reason, so that the core module requires none of them.
//
//	kernrpc serve -config kernrpc.yaml     serve the built-in echo service
//	kernrpc call -config kernrpc.yaml -text hi
//	kernrpc health -config kernrpc.yaml    ask every instance for its health
//	kernrpc plugins [-v]                   list every registered plugin
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	_ "github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
	_ "github.com/kernrpc/kernrpc/plugins/filter/prometheus"
	_ "github.com/kernrpc/kernrpc/plugins/registry/consul"
	_ "github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

const usage = `kernrpc: serve and call kernrpc services composed from plugin names.

Usage:
  kernrpc serve   -config FILE          serve the built-in echo service (method Echo.Echo)
  kernrpc call    -config FILE [flags]  call a service once and print the answer
  kernrpc health  -config FILE [flags]  ask every instance for its health; exit 1 unless all serve
  kernrpc plugins [-v]                  list every registered plugin by kind and name
  kernrpc help                          show this text

Run "kernrpc <command> -h" for a command's flags.
A config example is examples/echo/kernrpc.yaml.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code, so tests can
// drive every command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "call":
		err = call(ctx, args[1:], stdout, stderr)
	case "health":
		err = health(ctx, args[1:], stdout, stderr)
	case "plugins":
		err = plugins(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kernrpc: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(stderr, "kernrpc:", strings.TrimPrefix(err.Error(), "kernrpc: "))
	return 1
}

var errUsage = errors.New("usage")

func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kernrpc %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %q\n", fs.Args())
		fs.Usage()
		return errUsage
	}
	return nil
}

// loadConfig reads the config both commands take; a config that names no
// service means the built-in echo service.
func loadConfig(path string) (*kernrpc.Config, error) {
	if path == "" {
		return nil, errors.New("no config: pass -config FILE (see examples/echo/kernrpc.yaml)")
	}
	cfg, err := kernrpc.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	if cfg.Service == "" {
		cfg.Service = "echo"
	}
	return cfg, nil
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", "serve -config FILE", stderr)
	configPath := fs.String("config", "", "config file (YAML or JSON) naming the transport, codec, registry, balancer and filters")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		return err
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return err
	}
	// echopb.Echo speaks every built-in codec, so this one handler serves
	// whichever the config names and whichever a client sends.
	kernrpc.Handle(srv, "Echo.Echo", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil })
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "serving %s on %s (transport %s, codec %s, registry %s); methods: %s; answers calls in any codec of %s; Ctrl-C stops gracefully\n",
		cfg.Service, srv.Addr(), cfg.Transport.Name, cfg.Codec.Name, cfg.Registry.Name, strings.Join(srv.Methods(), ", "), strings.Join(codecNames(), ", "))
	<-ctx.Done()
	fmt.Fprintf(stdout, "shutting down (waiting up to %s for calls in flight)\n", cfg.Server.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
	defer cancel()
	return srv.Shutdown(sctx)
}

// codecNames lists the codecs compiled in: a server decodes a call in
// whichever of them the client used.
func codecNames() []string {
	var names []string
	for _, p := range kernel.Plugins() {
		if p.Kind == kernel.KindCodec {
			names = append(names, p.Name)
		}
	}
	return names
}

func call(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("call", "call -config FILE [-addr HOST:PORT] [-method Echo.Echo] [-text hello]", stderr)
	configPath := fs.String("config", "", "config file naming the transport, codec, registry and balancer")
	addr := fs.String("addr", "", "call this address instead of resolving the service through the registry")
	method := fs.String("method", "Echo.Echo", "method to call (the built-in echo service serves Echo.Echo)")
	text := fs.String("text", "hello", "text to send in the echo message")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		return err
	}
	if *addr != "" {
		cfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{
			"namespace": "kernrpc-call", "static": map[string]any{cfg.Service: []any{*addr}}}}
	} else if cfg.Registry.Name == "memory" && !listsStatic(cfg.Registry.Options, cfg.Service) {
		return fmt.Errorf("no address to call: %s names registry \"memory\", which lives inside one process, and lists no static address for %q; "+
			"pass -addr HOST:PORT (the address \"kernrpc serve\" printed), or list the server under registry.options.static.%s",
			cfg.Source, cfg.Service, cfg.Service)
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var resp echopb.Echo
	start := time.Now()
	if err := cli.Call(ctx, *method, &echopb.Echo{Text: *text}, &resp); err != nil {
		if kernel.CodeOf(err) == kernel.Unavailable && *addr == "" {
			return fmt.Errorf("%w; to call one server directly, pass -addr HOST:PORT", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "%s answered %q in %s\n", *method, resp.Text, time.Since(start).Round(time.Microsecond))
	return nil
}

// listsStatic reports whether memory registry options list static
// addresses for service.
func listsStatic(options map[string]any, service string) bool {
	static, _ := options["static"].(map[string]any)
	addrs, _ := static[service].([]any)
	return len(addrs) > 0
}

func plugins(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plugins", "plugins [-v]", stderr)
	verbose := fs.Bool("v", false, "also print each plugin's options with their defaults")
	if err := parse(fs, args); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tDESCRIPTION")
	for _, p := range kernel.Plugins() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Kind, p.Name, p.Doc)
		if *verbose && p.Defaults != nil {
			b, err := json.Marshal(p.Defaults)
			if err != nil {
				return fmt.Errorf("%s %s: options: %w", p.Kind, p.Name, err)
			}
			fmt.Fprintf(tw, "\t\tdefaults: %s\n", b)
		}
	}
	return tw.Flush()
}
