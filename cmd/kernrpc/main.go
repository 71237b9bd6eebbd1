// Command kernrpc serves a kernrpc service composed from a config file;
// lists, describes, calls and loads any service through its reflection
// service (or a descriptor set), with requests in JSON; health-checks
// services; and lists the plugins compiled into it: every built-in
// plugin, including those with modules of their own (etcd, consul,
// prometheus, otel-tracing). It is a module of its own for that reason, so
// that the core module requires none of them. See docs/reflection.md.
//
//	kernrpc serve -config kernrpc.yaml     serve the built-in echo service, with reflection
//	kernrpc list ADDR                      list its services and methods
//	kernrpc describe ADDR kernrpc.echo.EchoService.Echo
//	kernrpc call ADDR kernrpc.echo.EchoService.Echo '{"text":"hi"}'
//	kernrpc bench ADDR kernrpc.echo.EchoService.Echo '{"text":"hi"}' -c 64 -d 10s
//	kernrpc health ADDR [SERVICE]          ask a server for its health
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

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	_ "github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
	_ "github.com/kernrpc/kernrpc/plugins/filter/prometheus"
	_ "github.com/kernrpc/kernrpc/plugins/registry/consul"
	_ "github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

const usage = `kernrpc: serve, inspect, call and load kernrpc services.

Usage:
  kernrpc serve    -config FILE                    serve the built-in echo service, with reflection on
  kernrpc list     ADDR [SERVICE]                  list the services and methods a server serves
  kernrpc describe ADDR NAME                       print a service, method or message in .proto syntax
  kernrpc call     ADDR SERVICE.METHOD [JSON]      call a method with a JSON request; print the response
  kernrpc bench    ADDR SERVICE.METHOD [JSON]      load a method (-c callers, -d duration); print QPS and latencies
  kernrpc health   ADDR [SERVICE]                  ask a server for its health; exit 1 unless it serves
  kernrpc health   -config FILE [flags]            ask every instance the registry lists
  kernrpc call     -config FILE -addr ADDR -text T call the built-in echo service (Echo.Echo)
  kernrpc plugins  [-v]                            list every registered plugin by kind and name
  kernrpc help                                     show this text

ADDR is HOST:PORT, or with -registry or -config, a service name to resolve.
list, describe, call and bench read descriptors through the server's reflection
service (server.reflection: true; kernrpc serve has it on) or from -protoset FILE.
Run "kernrpc <command> -h" for a command's flags.
A config example is examples/echo/kernrpc.yaml; see docs/reflection.md.
`

func main() {
	os.Exit(runIO(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code, so tests can
// drive every command. Standard input is empty.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runIO(ctx, args, strings.NewReader(""), stdout, stderr)
}

// runIO is run with a standard input, which call and bench may read the
// request from.
func runIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "list":
		err = list(ctx, args[1:], stdout, stderr)
	case "describe":
		err = describe(ctx, args[1:], stdout, stderr)
	case "call":
		err = call(ctx, args[1:], stdin, stdout, stderr)
	case "bench":
		err = bench(ctx, args[1:], stdin, stdout, stderr)
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
	fs := newFlags("serve", "serve -config FILE [-reflection=false]\n\n"+
		"Serves the built-in echo service as Echo.Echo and, described by internal/echopb/echo.proto,\n"+
		"as "+echoMethod+", with the reflection service on, so that\n"+
		"kernrpc list, describe, call and bench work against it.", stderr)
	configPath := fs.String("config", "", "config file (YAML or JSON) naming the transport, codec, registry, balancer and filters")
	reflection := fs.Bool("reflection", true, "serve the reflection service (server.reflection), whatever the config says")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		return err
	}
	cfg.Server.Reflection = *reflection
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return err
	}
	// echopb.Echo speaks every built-in codec, so this one handler serves
	// whichever the config names and whichever a client sends. Under its
	// proto name too, where reflection finds its descriptor: generic calls
	// (kernrpc call) need it.
	echo := func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil }
	kernrpc.Handle(srv, "Echo.Echo", echo)
	kernrpc.Handle(srv, echoMethod, echo)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "serving %s on %s (transport %s, codec %s, registry %s); methods: %s; answers calls in any codec of %s; Ctrl-C stops gracefully\n",
		cfg.Service, srv.Addr(), cfg.Transport.Name, cfg.Codec.Name, cfg.Registry.Name, strings.Join(srv.Methods(), ", "), strings.Join(codecNames(), ", "))
	if a := srv.AdminAddr(); a != "" {
		fmt.Fprintf(stdout, "status console on http://%s/status (server.admin_address)\n", a)
	}
	<-ctx.Done()
	// A second Ctrl-C ends the wait for calls in flight at once. Heard
	// from before the first handler lets go, so that it never kills the
	// process with nothing closed.
	again, stopAgain := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopAgain()
	stop()
	fmt.Fprintf(stdout, "shutting down (waiting up to %s for calls in flight; Ctrl-C again to stop at once)\n", cfg.Server.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(again, cfg.Server.ShutdownTimeout.D())
	defer cancel()
	return srv.Shutdown(sctx)
}

// echoMethod is the built-in echo method under the name its .proto gives
// it (service kernrpc.echo.EchoService in internal/echopb/echo.proto).
const echoMethod = "kernrpc.echo.EchoService.Echo"

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
