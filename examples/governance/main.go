// Command governance runs one service whose config composes the governance
// filters: token-bucket, retry, hedge and breaker around the client; recover,
// overload, auth and token-bucket on the server. Three instances serve it, one of
// them failing and slow, and the command prints what each filter did.
//
//	go run ./examples/governance
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
	"github.com/kernrpc/kernrpc/plugins/filter/breaker"
	"github.com/kernrpc/kernrpc/plugins/filter/hedge"
	"github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
)

//go:embed kernrpc.yaml
var config []byte

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/governance\n\n"+
			"Serves one service from three instances, one failing and slow, and shows what each governance filter does.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	// The story goes to stdout; the filters' own logs (the recover filter
	// logs the panic's stack) would interleave with it.
	slog.SetLogLoggerLevel(slog.LevelError + 1)
	o, err := run(context.Background(), os.Stdout)
	if err == nil {
		err = o.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "governance:", err)
		os.Exit(1)
	}
}

// instance is one server of the service; bad ones fail Demo.Flaky and
// answer Demo.Slow slowly.
type instance struct {
	name  string
	bad   bool
	srv   *kernrpc.Server
	calls atomic.Int64
}

// outcome is what the scenes saw, for the test.
type outcome struct {
	flakyFailures, badFlakyCalls, flakyCalls int
	breakerOpen                              bool
	slowP99                                  time.Duration
	hedges                                   int64
	burstRejected, burstRetryAfter           int
	workServed, workShed                     int
	workShedMedian                           time.Duration
	panicCode, afterPanicCode                kernel.Code
	noTokenCode                              kernel.Code
	noTokenReachedHandler                    bool
}

// check returns an error naming each filter that did not do what the
// example prints it does, so that the example fails (exit 1) rather than
// tell a story that is not true.
func (o *outcome) check() error {
	var bad []string
	if o.flakyFailures != 0 {
		bad = append(bad, fmt.Sprintf("retry: %d Demo.Flaky calls failed; retry should have sent each to a healthy instance", o.flakyFailures))
	}
	if !o.breakerOpen || o.badFlakyCalls > o.flakyCalls/4 {
		bad = append(bad, fmt.Sprintf("breaker: open %v, the bad instance got %d of %d calls; want it open and the bad instance left alone", o.breakerOpen, o.badFlakyCalls, o.flakyCalls))
	}
	if o.hedges == 0 || o.slowP99 >= 150*time.Millisecond {
		bad = append(bad, fmt.Sprintf("hedge: %d hedges, slowest call %v; want hedges to answer before the slow instance's 200ms", o.hedges, o.slowP99))
	}
	if o.burstRejected == 0 || o.burstRetryAfter != o.burstRejected {
		bad = append(bad, fmt.Sprintf("token-bucket: %d burst calls rejected, %d with retry-after; want rejections that say when to retry", o.burstRejected, o.burstRetryAfter))
	}
	// How fast a shed call comes back depends on the machine's load (the
	// engine resends a shed call to the other instances first); the
	// overload package's own test measures it.
	if o.workServed == 0 || o.workShed == 0 {
		bad = append(bad, fmt.Sprintf("overload: served %d and shed %d; want both: the excess shed", o.workServed, o.workShed))
	}
	if o.panicCode != kernel.Internal || o.afterPanicCode != kernel.OK {
		bad = append(bad, fmt.Sprintf("recover: the panic answered %v, the next call %v; want Internal then OK", o.panicCode, o.afterPanicCode))
	}
	if o.noTokenCode != kernel.Unauthenticated || o.noTokenReachedHandler {
		bad = append(bad, fmt.Sprintf("auth: without a token %v, a handler ran %v; want Unauthenticated before any handler", o.noTokenCode, o.noTokenReachedHandler))
	}
	if len(bad) > 0 {
		return errors.New("not every filter did its part:\n  " + strings.Join(bad, "\n  "))
	}
	return nil
}

func run(ctx context.Context, out io.Writer) (*outcome, error) {
	cfg, err := kernrpc.ParseConfig(config, "examples/governance/kernrpc.yaml")
	if err != nil {
		return nil, err
	}
	var insts []*instance
	for _, name := range []string{"a", "b", "bad"} {
		in, err := serve(ctx, cfg, name)
		if err != nil {
			return nil, err
		}
		defer in.srv.Shutdown(ctx)
		insts = append(insts, in)
	}
	cli, err := kernrpc.NewClient(cfg, "")
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	o := &outcome{}
	bad := insts[2]

	// retry + breaker: the bad instance fails every Demo.Flaky call.
	before := bad.calls.Load()
	for range 200 {
		if err := call(ctx, cli, "Demo.Flaky"); err != nil {
			o.flakyFailures++
		}
	}
	o.flakyCalls, o.badFlakyCalls = 200, int(bad.calls.Load()-before)
	br, _ := kernrpc.FindPlugin[*breaker.Filter](cli.Plugins(), "breaker")
	o.breakerOpen = br.State("Demo.Flaky", bad.srv.Addr()) == breaker.Open
	fmt.Fprintf(out, "retry, breaker: 200 calls of Demo.Flaky, %d failed; the bad instance got %d of them and its breaker is %s\n",
		o.flakyFailures, o.badFlakyCalls, br.State("Demo.Flaky", bad.srv.Addr()))

	// hedge: the bad instance answers Demo.Slow after 200 ms.
	var took []time.Duration
	for range 60 {
		start := time.Now()
		if err := call(ctx, cli, "Demo.Slow"); err != nil {
			return nil, err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	o.slowP99 = took[len(took)*99/100]
	h, _ := kernrpc.FindPlugin[*hedge.Filter](cli.Plugins(), "hedge")
	o.hedges = h.Hedges()
	fmt.Fprintf(out, "hedge: 60 calls of Demo.Slow, %d hedged to another instance after 20ms; the slowest took %v, where the slow instance takes 200ms\n",
		o.hedges, o.slowP99.Round(time.Millisecond))

	// server token-bucket: 30 calls at once against a burst of 5 on each
	// of the three instances.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			md, err := cli.CallWithMetadata(ctx, "Demo.Burst", wrapperspb.String("x"), new(wrapperspb.StringValue))
			mu.Lock()
			defer mu.Unlock()
			if kernel.CodeOf(err) == kernel.ResourceExhausted {
				o.burstRejected++
				if md[tokenbucket.RetryAfterKey] != "" {
					o.burstRetryAfter++
				}
			}
		}()
	}
	wg.Wait()
	fmt.Fprintf(out, "token-bucket: 30 calls of Demo.Burst at once, %d rejected with ResourceExhausted, %d of them saying when to retry\n",
		o.burstRejected, o.burstRetryAfter)

	// overload: 150 calls at once of a method whose handler takes 50ms,
	// against a limit that starts at 20 calls in flight per instance.
	var shedTook []time.Duration
	for range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := call(ctx, cli, "Demo.Work")
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch kernel.CodeOf(err) {
			case kernel.OK:
				o.workServed++
			case kernel.ResourceExhausted:
				o.workShed++
				shedTook = append(shedTook, took)
			}
		}()
	}
	wg.Wait()
	if len(shedTook) > 0 {
		slices.Sort(shedTook)
		o.workShedMedian = shedTook[len(shedTook)/2]
	}
	fmt.Fprintf(out, "overload: 150 calls at once of Demo.Work (50ms each), %d served, %d shed with ResourceExhausted in %v (median), before their requests were decoded\n",
		o.workServed, o.workShed, o.workShedMedian.Round(100*time.Microsecond))

	// recover: a handler that panics costs one call, not the server.
	o.panicCode = kernel.CodeOf(call(ctx, cli, "Demo.Panic"))
	o.afterPanicCode = kernel.CodeOf(call(ctx, cli, "Demo.Flaky"))
	fmt.Fprintf(out, "recover: Demo.Panic answered %s; the next call answered %s\n", o.panicCode, o.afterPanicCode)

	// auth: a client without the token never reaches a handler.
	o.noTokenCode, o.noTokenReachedHandler, err = callWithoutToken(ctx, cfg, insts)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "auth: a client without the token got %s; a handler ran: %v\n", o.noTokenCode, o.noTokenReachedHandler)
	return o, nil
}

func call(ctx context.Context, cli *kernrpc.Client, method string) error {
	return cli.Call(ctx, method, wrapperspb.String("x"), new(wrapperspb.StringValue))
}

// serve starts one instance of the service.
func serve(ctx context.Context, cfg *kernrpc.Config, name string) (*instance, error) {
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return nil, err
	}
	in := &instance{name: name, bad: name == "bad", srv: srv}
	echo := func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		in.calls.Add(1)
		return wrapperspb.String(name), nil
	}
	kernrpc.Handle(srv, "Demo.Flaky", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if in.bad {
			in.calls.Add(1)
			return nil, kernel.Errorf(kernel.Unavailable, "instance %s is failing", name)
		}
		return echo(ctx, req)
	})
	kernrpc.Handle(srv, "Demo.Slow", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if in.bad {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echo(ctx, req)
	})
	kernrpc.Handle(srv, "Demo.Burst", echo)
	kernrpc.Handle(srv, "Demo.Work", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		time.Sleep(50 * time.Millisecond)
		return echo(ctx, req)
	})
	kernrpc.Handle(srv, "Demo.Panic", func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		panic("a handler bug")
	})
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	return in, nil
}

// callWithoutToken calls the service from a client whose config has no
// auth filter, and reports whether any handler ran.
func callWithoutToken(ctx context.Context, cfg *kernrpc.Config, insts []*instance) (kernel.Code, bool, error) {
	plain := *cfg
	plain.Filters = nil
	cli, err := kernrpc.NewClient(&plain, "")
	if err != nil {
		return 0, false, err
	}
	defer cli.Close()
	var before int64
	for _, in := range insts {
		before += in.calls.Load()
	}
	code := kernel.CodeOf(call(ctx, cli, "Demo.Flaky"))
	var after int64
	for _, in := range insts {
		after += in.calls.Load()
	}
	return code, after != before, nil
}
