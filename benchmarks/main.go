// Command benchmarks measures kernrpc against grpc-go and net/rpc on the
// same machine in the same run: echo calls over loopback, every server in
// a process of its own, rounds of the systems interleaved, in four modes
// (long connections, short connections, many client processes, server
// streaming). kernrpc runs on its default path (plain protoc-gen-go
// messages, no options), tuned, and through its generated client beside
// grpc-go's generated client. Run it from the module root:
//
//	go run ./benchmarks
//
// It prints progress on stderr, then markdown tables on stdout, and writes
// the same markdown to benchmarks/results/. See README.md for how to read it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `Usage: go run ./benchmarks [flags]

Measures echo calls over loopback with kernrpc (tcp-lv transport, protobuf
codec), grpc-go (unary, default options) and net/rpc (gob), side by side.
Each server runs in its own process (this binary, re-executed). For every
cell (a mode × payload × callers), the systems take turns round by round;
the many mode's cells of one payload take turns too.

kernrpc runs twice: "kernrpc" is the default path a new user gets (messages
from plain protoc-gen-go, internal/plainpb, and no options); "kernrpc tuned"
uses messages with vtprotobuf's methods (internal/echopb) and a server that
decodes requests in place (alias_requests). grpc-go uses the plain messages.
"kernrpc generated" and "grpc-go generated" call the echo service of
genpb/echo.proto through each one's generated client and server
(protoc-gen-kernrpc's, protoc-gen-go-grpc's), default options, the same
generated message; their ratios end the long mode with issue 17's targets.

Modes (-mode, comma-separated, or all):
  long   the callers share one client made before the round: -payloads × -callers
  short  every call makes a client, calls once and closes it: -short-callers, 16 B
  many   -clients client processes (this binary again), each one client shared
         by -client-callers callers, against one server process: -many-payload;
         with 1 among -clients, the other counts are divided by it
  stream server streaming: -streams concurrent streams sharing one client, each
         asking once for messages of one of -stream-sizes, which the server sends
         as fast as flow control allows until the round ends (-stream-duration);
         kernrpc, grpc-go and the protobuf floor only (net/rpc and the
         other floors cannot stream; the generated-code systems' proto
         declares only the unary method)

Per cell and system it reports calls/s, latency mean/p50/p99, and per call
the heap allocations and CPU time of the client side (the harness, or all
client processes in the many mode) and of the server process, then ratios:
kernrpc's default path to each peer first, then the tuned path's. The
stream mode reports the same per message received: messages/s, MiB/s, the
gap between two messages of a stream (timed for about one message in 16),
and the targets against grpc-go.

Flags:
`

const examples = `
Examples:
  go run ./benchmarks                                   # every mode, about %s
  go run ./benchmarks -mode=long -payloads=16 -callers=1 -rounds=1 # a quick look
  go run ./benchmarks -mode=short -systems=kernrpc,grpc,netrpc
  go run ./benchmarks -mode=many -clients=16 -client-callers=4 -systems=kernrpc,grpc,netrpc
  go run ./benchmarks -mode=many -many-payload=64KiB -clients=1,8,32 -client-callers=1 -systems=kernrpc-shm,kernrpc-shm-tuned,bare-shm
  go run ./benchmarks -mode=stream                      # server streaming, about %s
  go run ./benchmarks -mode=stream -stream-sizes=64KiB -streams=16 -systems=kernrpc,grpc -profile=/tmp/prof
  go run ./benchmarks -systems=kernrpc,grpc -duration=5s -out=/tmp/r.md
  go run ./benchmarks -mode=long -systems=kernrpc -payloads=16 -callers=1 -profile=/tmp/prof
  go run ./benchmarks -mode=long -codecs -systems=kernrpc        # kernrpc's four codecs
  go run ./benchmarks -mode=long -floors -payloads=16 -callers=1 # beside bare ping-pongs
`

func main() { os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr)) }

func mainCode(args []string, stdout, stderr io.Writer) int {
	if isServe(args) {
		return serveMain(args)
	}
	if isClientChild(args) {
		return clientMain(args)
	}
	o, out, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchmarks: %v\nRun with -h for usage.\n", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "benchmarks: cannot find this binary to run the servers: %v\n", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			fmt.Fprintf(stderr, "benchmarks: -profile: %v\n", err)
			return 1
		}
		stop, err := startCPUProfile(filepath.Join(o.profileDir, "client.pprof"))
		if err != nil {
			fmt.Fprintf(stderr, "benchmarks: -profile: %v\n", err)
			return 1
		}
		defer stop()
		fmt.Fprintf(stderr, "benchmarks: CPU profiles go to %s; look with go tool pprof -top %s/server-kernrpc.pprof\n", o.profileDir, o.profileDir)
	}

	cells := o.cells()
	fmt.Fprintf(stderr, "benchmarks: modes %s: %d cells × %d systems × %d rounds, about %s\n",
		strings.Join(o.modes, ", "), len(cells), len(o.running()), o.rounds, estimate(cells, o).Round(time.Second))
	b, err := runBenchmarks(ctx, exe, o)
	if err == nil && o.codecs {
		b.codecs, err = measureCodecs(ctx, o.progress)
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "benchmarks: interrupted; servers stopped, no results written")
			return 130
		}
		fmt.Fprintf(stderr, "benchmarks: %v\n", err)
		return 1
	}
	md := b.markdown(commandLine(args))
	fmt.Fprint(stdout, md)
	if out == "-" {
		return 0
	}
	if out == "" {
		out = defaultOutPath(b.started)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		fmt.Fprintf(stderr, "benchmarks: cannot create the results directory: %v (use -out to write elsewhere)\n", err)
		return 1
	}
	if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
		fmt.Fprintf(stderr, "benchmarks: cannot write results: %v (use -out to write elsewhere)\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "Results written to %s\n", out)
	return 0
}

// parseFlags returns the options and the -out path ("" for the default).
func parseFlags(args []string, stderr io.Writer) (options, string, error) {
	fs := flag.NewFlagSet("benchmarks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		def, _, _ := parseFlags(nil, io.Discard)
		st, _, _ := parseFlags([]string{"-mode=" + modeStream}, io.Discard)
		fmt.Fprintf(stderr, examples, estimate(def.cells(), def).Round(10*time.Second), estimate(st.cells(), st).Round(5*time.Second))
	}
	o := options{progress: stderr}
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time per round")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per system and cell; results add all rounds up")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured calls before each round, on the round's fresh client; in the many mode, after each client process's heap is warm ("+warmRule()+")")
	modes := fs.String("mode", "all", "modes to run, comma-separated: "+strings.Join(modeOrder, ", ")+", or all")
	payloads := fs.String("payloads", "16,64KiB", "long mode: payload sizes, comma-separated; B, KiB and MiB suffixes")
	callers := fs.String("callers", "1,4,64", "long mode: concurrent callers sharing one client, comma-separated")
	shortCallers := fs.String("short-callers", "1,4", "short mode: concurrent callers, each making a client per call, comma-separated")
	clients := fs.String("clients", "16", "many mode: client processes against the one server, comma-separated (a row each; with 1 among them, "+
		"the report divides the other rows by it)")
	fs.IntVar(&o.clientCallers, "client-callers", 4, "many mode: concurrent callers per client process, sharing its one client")
	manyPayloads := fs.String("many-payload", "16", "many mode: payload sizes, comma-separated; B, KiB and MiB suffixes")
	streamSizes := fs.String("stream-sizes", "16,64KiB", "stream mode: message sizes, comma-separated; B, KiB and MiB suffixes")
	streams := fs.String("streams", "1,16", "stream mode: concurrent streams sharing one client, comma-separated")
	fs.DurationVar(&o.streamDuration, "stream-duration", 500*time.Millisecond, "stream mode: measured time per round, in place of -duration "+
		"(a stream's rate settles at once, so the mode stays well under a minute)")
	systemList := fs.String("systems", strings.Join(defaultSystems, ","), "systems to compare, comma-separated: "+strings.Join(systemOrder, ", "))
	fs.BoolVar(&o.codecs, "codecs", false, "compare kernrpc's codecs: add "+strings.Join(codecSystems, ", ")+
		" to -systems, and measure each codec's marshal and unmarshal cost (about 30 s more)")
	floors := fs.Bool("floors", false, "measure what the machine allows without a framework: add "+strings.Join(floorSystems, ", ")+
		" (a plain ping-pong per caller over loopback TCP and over the shm-ring transport, each also carrying protobuf-go messages) to -systems")
	fs.BoolVar(&o.server.aliasRequests, "alias-requests", true, "the tuned kernrpc servers (kernrpc-tuned, kernrpc-shm-tuned) decode protobuf requests in place "+
		"(the codec's alias_requests option; the echo handler only reads its request); false leaves them only the vtprotobuf messages. "+
		"The default-path systems never set it")
	fs.StringVar(&o.profileDir, "profile", "", "directory for CPU profiles: client.pprof (this process) and server-<system>.pprof")
	out := fs.String("out", "", "results file (default benchmarks/results/<UTC date-time>.md; - for none)")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	if fs.NArg() > 0 {
		return o, "", fmt.Errorf("unexpected argument %q; every setting is a flag", fs.Arg(0))
	}
	var err error
	if o.duration <= 0 || o.streamDuration <= 0 || o.warmup < 0 || o.rounds < 1 {
		return o, "", errors.New("-duration and -stream-duration must be positive, -warmup not negative and -rounds at least 1")
	}
	if o.modes, err = parseModes(*modes); err != nil {
		return o, "", fmt.Errorf("-mode: %w", err)
	}
	if o.clients, err = parseList(*clients, parseClients); err != nil {
		return o, "", fmt.Errorf("-clients: %w", err)
	}
	if o.clientCallers < 1 || o.clientCallers > 10000 {
		return o, "", fmt.Errorf("-client-callers must be from 1 to 10000 (got %d)", o.clientCallers)
	}
	if o.shortCallers, err = parseList(*shortCallers, parseCallers); err != nil {
		return o, "", fmt.Errorf("-short-callers: %w", err)
	}
	if o.manyPayloads, err = parseList(*manyPayloads, parseSize); err != nil {
		return o, "", fmt.Errorf("-many-payload: %w", err)
	}
	if o.payloads, err = parseList(*payloads, parseSize); err != nil {
		return o, "", fmt.Errorf("-payloads: %w", err)
	}
	if o.callers, err = parseList(*callers, parseCallers); err != nil {
		return o, "", fmt.Errorf("-callers: %w", err)
	}
	if o.streamSizes, err = parseList(*streamSizes, parseSize); err != nil {
		return o, "", fmt.Errorf("-stream-sizes: %w", err)
	}
	if o.streams, err = parseList(*streams, parseCallers); err != nil {
		return o, "", fmt.Errorf("-streams: %w", err)
	}
	names := splitList(*systemList)
	if o.codecs {
		names = append(names, codecSystems...)
	}
	if *floors {
		names = append(names, floorSystems...)
	}
	if o.systems, err = lookupSystems(names); err != nil {
		return o, "", err
	}
	if slices.Contains(o.modes, modeStream) && !slices.ContainsFunc(o.systems, func(s *system) bool { return s.streams }) {
		return o, "", errors.New("the stream mode needs a system that streams (kernrpc's or grpc) in -systems; or leave stream out of -mode")
	}
	return o, *out, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseList(s string, parse func(string) (int, error)) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		// Two equal values (16 and 16B too) would make two identical
		// cells, which share one result: the rounds of both would add up
		// in it, or the second's replace the first's.
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("%q repeats a value given before it", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// maxPayload keeps a request and its echo under the 4 MiB message limit
// that grpc-go and kernrpc apply by default.
const maxPayload = 1 << 20

func parseSize(s string) (int, error) {
	num, mult := s, 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q: want a byte count such as 16, 512B, 64KiB or 1MiB", s)
	}
	if v > maxPayload/mult { // before multiplying, which could overflow into a small or negative size
		return 0, fmt.Errorf("size %q is over %s, the most every system accepts by default", s, sizeName(maxPayload))
	}
	return v * mult, nil
}

// parseCallers and parseClients read one count of a list flag.
var (
	parseCallers = countParser("callers count", 10000)
	parseClients = countParser("client process count", 256)
)

// countParser reads a count from 1 to most, naming what it counts when it
// is not one.
func countParser(what string, most int) func(string) (int, error) {
	return func(s string) (int, error) {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > most {
			return 0, fmt.Errorf("bad %s %q: want an integer from 1 to %d", what, s, most)
		}
		return v, nil
	}
}

// commandLine is how to repeat this run. Under go run the binary lives in
// a temporary directory, so it is shown as go run ./benchmarks instead.
func commandLine(args []string) string {
	cmd := filepath.Base(os.Args[0])
	if strings.Contains(os.Args[0], "go-build") {
		cmd = "go run ./benchmarks"
	}
	for _, a := range args {
		if strings.ContainsAny(a, " \t\"'$") {
			a = strconv.Quote(a)
		}
		cmd += " " + a
	}
	return cmd
}

// defaultOutPath is benchmarks/results/<time>.md under the module root,
// found by walking up from the working directory, so that the results land
// in the same place whether run from the root or from benchmarks/.
func defaultOutPath(t time.Time) string {
	name := t.UTC().Format("2006-01-02T15-04-05Z") + ".md"
	dir, err := os.Getwd()
	for err == nil {
		if data, rerr := os.ReadFile(filepath.Join(dir, "go.mod")); rerr == nil && strings.Contains(string(data), "module github.com/kernrpc/kernrpc\n") {
			return filepath.Join(dir, "benchmarks", "results", name)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return filepath.Join("results", name)
}
