package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/kernel"
)

const benchSynopsis = `bench [flags] ADDR SERVICE.METHOD ['{json}' | @FILE | -]

Calls a unary method from -c callers at once for -d (or -n calls), printing a
progress line on standard error once a second, then the calls, QPS, latency
percentiles (p50, p90, p99, max) and the calls by status code as a table, or
as JSON with -o json. The request is built once, from JSON, through the
server's reflection service (or -protoset). Ctrl-C ends the run early and
prints the figures so far. Exits 1 if no call succeeded.`

// benchRun is what one bench measures, and how.
type benchRun struct {
	cli      *kernrpc.Client
	method   string
	req      *dynamicpb.Message
	newResp  func() *dynamicpb.Message
	opts     []kernrpc.CallOption
	callers  int
	duration time.Duration
	limit    int64 // calls in all; 0: no limit
}

// caller is one caller's figures; each caller writes only its own, and the
// progress line reads the atomic counts.
type caller struct {
	lat     latencies
	calls   atomic.Int64
	errs    atomic.Int64
	byCode  map[kernel.Code]int64
	example map[kernel.Code]string
}

func bench(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("bench", benchSynopsis, stderr)
	var d dialFlags
	d.add(fs, true)
	callers := fs.Int("c", 16, "callers calling at once")
	duration := fs.Duration("d", 10*time.Second, "how long to call (0 with -n: until -n calls)")
	limit := fs.Int64("n", 0, "stop after this many calls in all (0: no limit)")
	output := fs.String("o", "table", "output: table or json")
	pool := fs.Int("pool", 0, "connections per instance (0: the config's client.pool_size, 1 by default)")
	pos, err := parseAnywhere(fs, args, 2, 3)
	if err != nil {
		return err
	}
	if err := checkBenchFlags(fs, *callers, *duration, *limit, *output, *pool); err != nil {
		return err
	}
	reqArg := "{}"
	if len(pos) == 3 {
		reqArg = pos[2]
	}
	data, err := readData(reqArg, stdin)
	if err != nil {
		return err
	}
	e, err := d.dialPool(pos[0], *pool)
	if err != nil {
		return err
	}
	defer e.Close()
	run, err := prepareBench(ctx, e, &d, pos[1], data)
	if err != nil {
		return err
	}
	run.callers, run.duration, run.limit = *callers, *duration, *limit
	// Ctrl-C ends the run early, with the figures so far; without this it
	// would kill the process and print nothing. A second one, once stop
	// has given the signal back, kills as usual.
	sctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	res := run.run(sctx, stderr)
	stop()
	res.Target, res.Codec = e.what, e.cfg.Codec.Name
	if *output == "json" {
		err = res.writeJSON(stdout)
	} else {
		err = res.writeTable(stdout)
	}
	if err != nil {
		return err
	}
	if res.OK == 0 {
		return fmt.Errorf("no call of %s succeeded (%d failed)", res.Method, res.Errors)
	}
	return nil
}

func checkBenchFlags(fs *flag.FlagSet, callers int, duration time.Duration, limit int64, output string, pool int) error {
	var problem string
	switch {
	case callers < 1:
		problem = fmt.Sprintf("-c %d: want at least 1 caller", callers)
	case duration < 0 || (duration == 0 && limit == 0):
		problem = fmt.Sprintf("-d %s: want a positive duration (or -d 0 with -n)", duration)
	case limit < 0:
		problem = fmt.Sprintf("-n %d: want a positive number of calls", limit)
	case output != "table" && output != "json":
		problem = fmt.Sprintf("-o %q: want table or json", output)
	case pool < 0:
		problem = fmt.Sprintf("-pool %d: want a positive number of connections", pool)
	default:
		return nil
	}
	return usageProblem(fs, problem)
}

// dialPool is dial with the client's connections per instance set.
func (d *dialFlags) dialPool(target string, pool int) (*endpoint, error) {
	e, err := d.dial(target)
	if err != nil || pool == 0 || pool == e.cfg.Client.PoolSize {
		return e, err
	}
	e.cli.Close()
	cfg := *e.cfg
	cfg.Client.PoolSize = pool
	if e.cli, err = kernrpc.NewClient(&cfg, cfg.Service); err != nil {
		return nil, err
	}
	e.cfg = &cfg
	if d.protoset == "" {
		e.source = generic.NewReflectionSource(e.cli, d.callOptions()...)
	}
	return e, nil
}

// prepareBench finds the method and builds its request once.
func prepareBench(ctx context.Context, e *endpoint, d *dialFlags, method string, data []byte) (*benchRun, error) {
	lctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	g := generic.NewClient(e.cli, e.source)
	md, err := g.Method(lctx, method)
	if err != nil {
		return nil, err
	}
	method = string(md.FullName()) // the name it is served under, without a leading dot
	if k := generic.KindOf(md); k != generic.Unary {
		return nil, fmt.Errorf("%s is %s: bench calls unary methods", method, k)
	}
	req, err := g.DecodeJSON(lctx, md.Input(), data)
	if err != nil {
		return nil, fmt.Errorf("request of %s: %w", method, err)
	}
	out := md.Output()
	return &benchRun{cli: e.cli, method: method, req: req, opts: d.callOptions(),
		newResp: func() *dynamicpb.Message { return dynamicpb.NewMessage(out) }}, nil
}

// run calls until the duration or the call limit is reached, or ctx ends
// (Ctrl-C: the calls in flight are cancelled and the figures so far
// printed).
func (b *benchRun) run(ctx context.Context, progress io.Writer) *benchResult {
	callers := make([]*caller, b.callers)
	for i := range callers {
		callers[i] = &caller{byCode: map[kernel.Code]int64{}, example: map[kernel.Code]string{}}
	}
	var stop atomic.Bool
	var started atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	begin := time.Now()
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.loop(ctx, c, &stop, &started)
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	b.watch(ctx, begin, callers, &stop, finished, progress)
	elapsed := time.Since(begin)
	return b.result(callers, elapsed)
}

func (b *benchRun) loop(ctx context.Context, c *caller, stop *atomic.Bool, started *atomic.Int64) {
	resp := b.newResp()
	for !stop.Load() && ctx.Err() == nil {
		if b.limit > 0 && started.Add(1) > b.limit {
			return
		}
		t0 := time.Now()
		err := b.cli.Call(ctx, b.method, b.req, resp, b.opts...)
		took := time.Since(t0)
		if err != nil && ctx.Err() != nil {
			return // cut short by the run's end (Ctrl-C), not failed by the server
		}
		c.calls.Add(1)
		code := kernel.CodeOf(err)
		c.byCode[code]++
		if err == nil {
			c.lat.add(took)
			continue
		}
		c.errs.Add(1)
		if _, ok := c.example[code]; !ok {
			c.example[code] = kernel.StatusOf(err).Message
		}
	}
}

// watch prints the progress line once a second until the callers have
// finished, telling them to stop when the duration has passed or ctx
// ends. On a terminal the line is rewritten in place.
func (b *benchRun) watch(ctx context.Context, begin time.Time, callers []*caller, stop *atomic.Bool, finished <-chan struct{}, w io.Writer) {
	tty := isTerminal(w)
	var deadline <-chan time.Time
	if b.duration > 0 {
		t := time.NewTimer(b.duration)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last int64
	lastAt := begin
	done := ctx.Done()
	for {
		select {
		case <-finished:
			if tty {
				fmt.Fprintln(w)
			}
			return
		case <-deadline:
			stop.Store(true)
			deadline = nil
		case <-done: // the callers' calls are cancelled too
			stop.Store(true)
			done = nil
		case now := <-tick.C:
			var calls, errs int64
			for _, c := range callers {
				calls += c.calls.Load()
				errs += c.errs.Load()
			}
			rate := float64(calls-last) / now.Sub(lastAt).Seconds()
			last, lastAt = calls, now
			at := now.Sub(begin).Round(time.Second).String()
			if b.duration > 0 {
				at += "/" + b.duration.String()
			}
			line := fmt.Sprintf("%s  %s: %d calls, %.0f/s now, %d errors", at, b.method, calls, rate, errs)
			if tty {
				fmt.Fprintf(w, "\r%s\x1b[K", line)
			} else {
				fmt.Fprintln(w, line)
			}
		}
	}
}

// isTerminal reports whether w is a terminal, where the progress line is
// rewritten in place rather than printed once a second.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// benchResult is what bench prints.
type benchResult struct {
	Method   string            `json:"method"`
	Target   string            `json:"target"`
	Codec    string            `json:"codec"`
	Callers  int               `json:"callers"`
	Seconds  float64           `json:"duration_seconds"`
	Calls    int64             `json:"calls"`
	OK       int64             `json:"ok"`
	Errors   int64             `json:"errors"`
	QPS      float64           `json:"qps"`
	Latency  latencyFigures    `json:"latency_us"` // of the calls that succeeded
	Codes    map[string]int64  `json:"codes"`
	Examples map[string]string `json:"error_examples,omitempty"` // the first message of each code
	lat      latencies
}

type latencyFigures struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func (b *benchRun) result(callers []*caller, elapsed time.Duration) *benchResult {
	r := &benchResult{Method: b.method, Callers: b.callers, Seconds: elapsed.Seconds(), Codes: map[string]int64{}, Examples: map[string]string{}}
	for _, c := range callers {
		r.lat.merge(&c.lat)
		for code, n := range c.byCode {
			r.Codes[code.String()] += n
			r.Calls += n
			if code != kernel.OK {
				r.Errors += n
			}
		}
		for code, msg := range c.example {
			if _, ok := r.Examples[code.String()]; !ok {
				r.Examples[code.String()] = msg
			}
		}
	}
	r.OK = r.Calls - r.Errors
	if elapsed > 0 {
		r.QPS = float64(r.Calls) / elapsed.Seconds()
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r.Latency = latencyFigures{P50: us(r.lat.quantile(0.50)), P90: us(r.lat.quantile(0.90)), P99: us(r.lat.quantile(0.99)), Max: us(r.lat.max)}
	return r
}

func (r *benchResult) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// sig rounds d to three significant digits, for reading.
func sig(d time.Duration) time.Duration {
	p := time.Duration(1)
	for p*1000 <= d {
		p *= 10
	}
	return d.Round(p)
}

func (r *benchResult) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "method\t%s\n", r.Method)
	fmt.Fprintf(tw, "target\t%s (codec %s)\n", r.Target, r.Codec)
	fmt.Fprintf(tw, "callers\t%d\n", r.Callers)
	fmt.Fprintf(tw, "duration\t%s\n", sig(time.Duration(r.Seconds*float64(time.Second))))
	fmt.Fprintf(tw, "calls\t%d (%d OK, %d errors)\n", r.Calls, r.OK, r.Errors)
	fmt.Fprintf(tw, "QPS\t%.1f\n", r.QPS)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "latency (OK calls)\tp50\tp90\tp99\tmax")
	fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\n", sig(r.lat.quantile(0.50)), sig(r.lat.quantile(0.90)), sig(r.lat.quantile(0.99)), sig(r.lat.max))
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "code\tcalls\tfirst message")
	codes := make([]string, 0, len(r.Codes))
	for c := range r.Codes {
		codes = append(codes, c)
	}
	slices.SortFunc(codes, func(a, b string) int { return codeOrder(a) - codeOrder(b) })
	for _, c := range codes {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", c, r.Codes[c], r.Examples[c])
	}
	return tw.Flush()
}

func codeOrder(name string) int {
	c, err := kernel.ParseCode(name)
	if err != nil {
		return 1 << 20
	}
	return int(c)
}
