package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// errUnhealthy makes health exit 1 once its table is printed.
var errUnhealthy = errors.New("unhealthy")

// health asks every instance of the service (or the one at -addr) for its
// health, prints a table, and fails unless all of them are serving, the
// way grpc_health_probe does, so that scripts and probes can use it.
func health(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("health", "health [flags] ADDR [SERVICE]\n       kernrpc health -config FILE [-addr HOST:PORT] [-service NAME]\n\n"+
		"Asks a server (ADDR), or every instance of the config's service the registry lists, for the\n"+
		"health of SERVICE (default: the whole server with ADDR, else the config's service); exits 1\n"+
		"unless every answer is SERVING.", stderr)
	configPath := fs.String("config", "", "config file naming the transport, registry and client filters, such as auth (optional with ADDR)")
	addr := fs.String("addr", "", "ask this address instead of every instance the registry lists")
	service := fs.String("service", "", `service to ask about (default: the config's service; "-" asks about the whole server)`)
	timeout := 5 * time.Second
	fs.Var((*timeoutFlag)(&timeout), "timeout", "give up on the registry lookup, and on each instance, after this `duration`")
	pos, err := parseAnywhere(fs, args, 0, 2)
	if err != nil {
		return err
	}
	if len(pos) > 0 && *addr != "" {
		return usageProblem(fs, "the address is given twice: as an argument and with -addr; pass one")
	}
	if len(pos) == 2 && *service != "" {
		return usageProblem(fs, "the service is given twice: as an argument and with -service; pass one")
	}
	var cfg *kernrpc.Config
	switch {
	case *configPath == "" && len(pos) > 0:
		cfg = kernrpc.DefaultConfig()
		cfg.Service = "kernrpc-health"
	default:
		if cfg, err = loadConfig(*configPath); err != nil {
			return err
		}
	}
	about := cfg.Service
	if len(pos) > 0 {
		// A server asked by address: about the whole server, unless named.
		*addr, about = pos[0], ""
		if len(pos) == 2 {
			*service = pos[1]
		}
	}
	switch *service {
	case "-":
		about = ""
	case "":
	default:
		about = *service
	}
	insts, err := instancesToAsk(ctx, cfg, *addr, timeout)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tADDRESS\tTIME\tSTATUS")
	healthy := true
	for _, inst := range insts {
		start := time.Now()
		st, err := askHealth(ctx, cfg, inst.Address, about, timeout)
		status := string(st)
		if err != nil {
			status = "ERROR: " + err.Error()
		}
		healthy = healthy && err == nil && st == kernrpc.HealthServing
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", inst.ID, inst.Address, time.Since(start).Round(time.Microsecond), status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !healthy {
		if len(pos) > 0 {
			return fmt.Errorf("%w: %s is not serving", errUnhealthy, *addr)
		}
		return fmt.Errorf("%w: not every instance of %q is serving", errUnhealthy, cfg.Service)
	}
	return nil
}

// instancesToAsk is the -addr given, or what the config's registry lists
// within timeout: a probe's -timeout bounds the whole run, not only the
// instances it reaches.
func instancesToAsk(ctx context.Context, cfg *kernrpc.Config, addr string, timeout time.Duration) ([]kernel.Instance, error) {
	if addr != "" {
		return []kernel.Instance{{Service: cfg.Service, ID: addr, Address: addr}}, nil
	}
	if cfg.Registry.Name == "memory" && !listsStatic(cfg.Registry.Options, cfg.Service) {
		return nil, fmt.Errorf("no instance to ask: %s names registry \"memory\", which lives inside one process; pass -addr HOST:PORT", cfg.Source)
	}
	reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, cfg.Source)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	insts, err := reg.Resolve(rctx, cfg.Service)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return nil, fmt.Errorf("resolve %q through registry %q: no answer within -timeout %s", cfg.Service, cfg.Registry.Name, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %q through registry %q: %w", cfg.Service, cfg.Registry.Name, err)
	}
	if len(insts) == 0 {
		return nil, fmt.Errorf("registry %q lists no instance of %q (a server that is not serving leaves it); pass -addr HOST:PORT to ask one directly", cfg.Registry.Name, cfg.Service)
	}
	return insts, nil
}

// askHealth asks the server at addr, on a client of its own.
func askHealth(ctx context.Context, cfg *kernrpc.Config, addr, service string, timeout time.Duration) (kernrpc.HealthStatus, error) {
	// The config's client filters apply, as they do to call, list and
	// bench: a server filter guards the health service like any method
	// (auth), and the client's side of it is what passes.
	one := *cfg
	// protobuf, which every server has built in, whatever the config's
	// codec: the health messages are protobuf well-known types.
	one.Codec = kernrpc.PluginConfig{Name: kernrpc.DefaultCodec}
	one.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{
		"namespace": "kernrpc-health", "static": map[string]any{cfg.Service: []any{addr}}}}
	cli, err := kernrpc.NewClient(&one, cfg.Service)
	if err != nil {
		return kernrpc.HealthUnknown, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return cli.CheckHealth(ctx, service)
}
