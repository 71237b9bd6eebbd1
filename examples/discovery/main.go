// Command discovery shows service discovery across processes: it starts an
// embedded etcd, three echo servers (each a process of its own) and a
// client, all composed from kernrpc.yaml with registry etcd. Midway it
// kills one server with SIGKILL; the client's traffic moves to the other
// two within the registration TTL, and no call fails that had a retry
// left. It prints what it does as it goes.
//
//	go run ./examples/discovery
package main

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	_ "github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

//go:embed kernrpc.yaml
var config []byte

const configSource = "examples/discovery/kernrpc.yaml"

// serveEnv, when set to "ENDPOINT NAME", makes the binary one of the
// servers instead of the demo.
const serveEnv = "KERNRPC_DISCOVERY_SERVE"

func main() {
	opts := options{}
	flag.DurationVar(&opts.duration, "duration", 10*time.Second, "how long the client calls")
	flag.DurationVar(&opts.killAfter, "kill-after", 4*time.Second, "when to kill one server, from the first call")
	flag.IntVar(&opts.callers, "callers", 8, "concurrent callers")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/discovery [flags]\n\n"+
			"Starts an embedded etcd, three echo servers in processes of their own and a client,\n"+
			"kills one server midway and shows the traffic moving to the other two.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	// The story goes to stdout; the plugins' own logs would interleave.
	slog.SetLogLoggerLevel(slog.LevelError + 1)
	if spec := os.Getenv(serveEnv); spec != "" {
		// A server started by the demo (its arguments are for a test binary).
		if err := serveChild(spec, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "discovery server:", err)
			os.Exit(1)
		}
		return
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, os.Stdout, opts)
	if err == nil && rep.failed > 0 {
		err = fmt.Errorf("%d calls failed", rep.failed)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "discovery:", err)
		os.Exit(1)
	}
}

// loadConfig is kernrpc.yaml pointed at the etcd endpoint.
func loadConfig(endpoint string) (*kernrpc.Config, error) {
	cfg, err := kernrpc.ParseConfig(config, configSource)
	if err != nil {
		return nil, err
	}
	cfg.Registry.Options["endpoints"] = []any{endpoint}
	return cfg, nil
}

// serveChild is one server: it answers Echo.Who with its name until
// SIGTERM, then shuts down gracefully.
func serveChild(spec string, out io.Writer) error {
	endpoint, name, ok := strings.Cut(spec, " ")
	if !ok {
		return fmt.Errorf("%s=%q: want \"ENDPOINT NAME\"", serveEnv, spec)
	}
	cfg, err := loadConfig(endpoint)
	if err != nil {
		return err
	}
	cfg.Server.InstanceID = name
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return err
	}
	kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String(name), nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := srv.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintln(out, "ready", srv.Addr())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
	defer cancel()
	return srv.Shutdown(sctx)
}

// child is a server process.
type child struct {
	name, addr string
	cmd        *exec.Cmd
	exited     chan error
}

// startChild runs this binary again as the server called name.
func startChild(ctx context.Context, endpoint, name string) (*child, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+endpoint+" "+name)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- addr
			}
		}
		c.exited <- cmd.Wait()
	}()
	select {
	case c.addr = <-ready:
		return c, nil
	case err := <-c.exited:
		return nil, fmt.Errorf("server %s exited before it was ready: %v", name, err)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return nil, errors.New("server " + name + " not ready after 30s")
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, ctx.Err()
	}
}

// stop ends the server gracefully, or kills it after timeout.
func (c *child) stop(timeout time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}
