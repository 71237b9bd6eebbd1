package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The child side. The harness runs every server in a process of its own,
// re-executing its own binary as
//
//	benchmarks -serve=grpc -addr=127.0.0.1:0
//
// because a server sharing the client's process (and scheduler, and GC)
// makes a lone caller about twice as fast as it would be across processes.
//
// Protocol on the child's stdin and stdout, one line each:
//
//	child:   <listening address>          once, when serving
//	harness: stats
//	child:   stats <mallocs> <cpu ns> <logs>
//	                                      runtime.MemStats.Mallocs, user+system CPU,
//	                                      log records at INFO and above so far
//	harness: dump <file>                  when a call hangs, for the diagnosis
//	child:   dumped                       its goroutine stacks are in <file>
//
// The child stops when its stdin closes (the harness exited, even if it was
// killed), on SIGTERM, or on SIGINT.

// serveFlag marks a child invocation; it is not in the harness's flag set,
// so -h does not show it.
const serveFlag = "-serve="

// isServe reports whether args ask for the child side.
func isServe(args []string) bool { return hasChildFlag(args, serveFlag) }

// hasChildFlag reports whether args hold flag (given as "-name="), with
// one dash or two.
func hasChildFlag(args []string, flag string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, flag) || strings.HasPrefix(a, "-"+flag) {
			return true
		}
	}
	return false
}

// serveMain runs one echo server until told to stop and returns the exit code.
func serveMain(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	name := fs.String("serve", "", "system to serve: "+strings.Join(systemOrder, ", "))
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	var so serveOptions
	fs.BoolVar(&so.aliasRequests, "alias-requests", false, "kernrpc: decode protobuf requests in place (the codec's alias_requests)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *profile != "" {
		stop, err := startCPUProfile(*profile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchmarks -serve=%s: %v\n", *name, err)
			return 1
		}
		defer stop()
	}
	sys, ok := systems[*name]
	if !ok {
		fmt.Fprintf(os.Stderr, "benchmarks -serve: unknown system %q; known: %s\n", *name, strings.Join(systemOrder, ", "))
		return 2
	}
	// Info logs (kernrpc's "serving", "stopped") would interleave with the
	// harness's progress lines; warnings and errors still show. All are
	// counted: a server that logs per connection shows in the short mode.
	slog.SetDefault(slog.New(&countingHandler{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})}))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()

	listening, stop, err := sys.serve(ctx, *addr, so)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchmarks -serve=%s: %v\n", *name, err)
		return 1
	}
	fmt.Println(listening)

	done := make(chan error, 1)
	go func() { done <- answerStats(os.Stdin, os.Stdout) }()
	select {
	case err = <-done:
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if serr := stop(sctx); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchmarks -serve=%s: %v\n", *name, err)
		return 1
	}
	return 0
}

// answerStats answers "stats" lines until in closes.
func answerStats(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		var err error
		switch cmd {
		case "stats":
			s := readProcStats()
			_, err = fmt.Fprintf(out, "stats %d %d %d\n", s.mallocs, s.cpu.Nanoseconds(), serverLogs.Load())
		case "dump":
			if derr := dumpGoroutines(arg); derr != nil {
				_, err = fmt.Fprintf(out, "dump failed: %v\n", derr)
			} else {
				_, err = fmt.Fprintln(out, "dumped")
			}
		default:
			return fmt.Errorf("unexpected request %q on stdin; the harness sends only \"stats\" and \"dump <file>\"", sc.Text())
		}
		if err != nil {
			return err
		}
	}
	return sc.Err()
}

// serverLogs counts the server child's log records at INFO and above.
var serverLogs atomic.Uint64

// countingHandler counts the records at INFO and above, through slog or
// the log package (which slog.SetDefault routes here), and passes on those
// its Handler takes.
type countingHandler struct{ slog.Handler }

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	serverLogs.Add(1)
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &countingHandler{h.Handler.WithAttrs(as)}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{h.Handler.WithGroup(name)}
}

// procStats is what a process has spent so far; the difference of two
// snapshots over a measured window is divided by the calls made in it.
type procStats struct {
	mallocs uint64        // heap objects allocated
	cpu     time.Duration // user + system CPU time
	logs    uint64        // log records at INFO and above (server children only)
}

func (s procStats) sub(o procStats) procStats {
	return procStats{mallocs: s.mallocs - o.mallocs, cpu: s.cpu - o.cpu, logs: s.logs - o.logs}
}

// Preallocated so that taking a snapshot allocates nothing in the window it
// measures. Only one goroutine at a time takes snapshots.
var (
	snapMem   runtime.MemStats
	snapUsage syscall.Rusage
)

// readProcStats snapshots this process. ReadMemStats stops the world for a
// few microseconds, which is why it runs twice per round and never per call.
func readProcStats() procStats {
	runtime.ReadMemStats(&snapMem)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &snapUsage); err != nil {
		panic("getrusage: " + err.Error()) // cannot fail for RUSAGE_SELF
	}
	cpu := time.Duration(snapUsage.Utime.Nano() + snapUsage.Stime.Nano())
	return procStats{mallocs: snapMem.Mallocs, cpu: cpu}
}

// dumpGoroutines writes every goroutine's stack to path: when a call hangs,
// the two processes' stacks say which side lost it.
func dumpGoroutines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("goroutine").WriteTo(f, 2); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startCPUProfile profiles this process into path until the returned
// function is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
