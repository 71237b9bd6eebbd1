package faultharness_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/transport/faulty"
	_ "github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

const (
	method = "Harness.Do"
	// idKey carries each call's number, so that the server counts its
	// executions; the request's payload carries it too, so that a
	// corrupted copy is told from the call itself.
	idKey = "x-harness-call"
	// margin is how late past its deadline a call may end: the time a
	// loaded machine running -race takes to notice and report it. Beside
	// a fuzzing run (both cores busy) calls ended up to 739ms late, so
	// 250ms failed there; a call that ignored its deadline would end at
	// the keepalive's verdict, 15s on, or never.
	margin = time.Second
)

// run is one harness run: its shape and what it found.
type run struct {
	transport   string // the wrapped transport
	faults      map[string]any
	calls       int
	concurrency int
	deadline    time.Duration
	// garbles says the fault can change what a request or answer says
	// (corruption, truncation): the protocol carries no checksum, so an
	// altered answer is the fault's, not the engine's.
	garbles bool
}

// tally is what one run observed.
type tally struct {
	outcomes   []atomic.Int32 // per call
	executions sync.Map       // call number → *atomic.Int32, intact requests only
	garbled    atomic.Int32   // executions of requests the fault altered
	mu         sync.Mutex
	codes      map[kernel.Code]int
	altered    int           // answers that were not the request's own
	unexecuted int           // successes no execution accounts for
	maxOver    time.Duration // latest outcome past its deadline
	maxTook    time.Duration // slowest outcome
}

func newTally(calls int) *tally {
	return &tally{outcomes: make([]atomic.Int32, calls), codes: map[kernel.Code]int{}}
}

func (t *tally) execute(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	id := kernrpc.IncomingMetadata(ctx)[idKey]
	if req.GetValue() != payload(id) {
		t.garbled.Add(1)
	} else {
		n, _ := t.executions.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
	}
	return wrapperspb.String(req.GetValue()), nil
}

func (t *tally) execs(id string) int32 {
	if n, ok := t.executions.Load(id); ok {
		return n.(*atomic.Int32).Load()
	}
	return 0
}

func payload(id string) string { return "request of call " + id }

// outcome records call i's outcome, which arrived took after it started.
func (t *tally) outcome(r *run, i int, took time.Duration, resp *wrapperspb.StringValue, err error) {
	t.outcomes[i].Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maxOver = max(t.maxOver, took-r.deadline)
	t.maxTook = max(t.maxTook, took)
	if err != nil {
		t.codes[kernel.StatusOf(err).Code]++
		return
	}
	t.codes[kernel.OK]++
	id := strconv.Itoa(i)
	if resp.GetValue() != payload(id) {
		t.altered++
	} else if t.execs(id) == 0 {
		t.unexecuted++
	}
}

// config is the engine's config for r: the faulty transport around r's,
// with r's faults; the server and the client each take the side they use.
func (r *run) config(t *testing.T) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "harness"
	cfg.Registry.Options = map[string]any{"namespace": "faultharness/" + t.Name()}
	cfg.Client.PoolSize = 2
	cfg.Server.ShutdownTimeout = kernel.Duration(2 * time.Second)
	inner := map[string]any{"name": r.transport}
	if r.transport == "shm-ring" {
		inner["options"] = map[string]any{"ring_size": "256KiB"}
	}
	options := map[string]any{"transport": inner, "seed": 15}
	for k, v := range r.faults {
		options[k] = v
	}
	cfg.Transport = kernrpc.PluginConfig{Name: "faulty", Options: options}
	return cfg
}

// exercise runs r and checks every call's accounting and the baselines.
func (r *run) exercise(t *testing.T) {
	fds := openFDs(t)
	leaks := goleak.IgnoreCurrent()
	cfg := r.config(t)
	tl := newTally(r.calls)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, method, tl.execute)
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.drive(cli, tl)
	took := time.Since(start)
	cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // an outcome delivered twice would come now
	r.check(t, tl)
	t.Logf("%s over %s: %d calls in %s: outcomes %v, altered %d, garbled executions %d, slowest %s (%s past the deadline)",
		fmt.Sprint(r.faults), r.transport, r.calls, took.Round(time.Millisecond), tl.codes, tl.altered, tl.garbled.Load(),
		tl.maxTook.Round(time.Millisecond), tl.maxOver.Round(time.Millisecond))
	if err := goleak.Find(leaks); err != nil {
		t.Errorf("goroutines outlived the server and the client: %v", err)
	}
	if err := fdsBackTo(fds); err != nil {
		t.Error(err)
	}
}

// drive makes r.calls calls, r.concurrency at a time, each by one of the
// three call models in turn.
func (r *run) drive(cli *kernrpc.Client, tl *tally) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, r.concurrency)
	for i := range r.calls {
		sem <- struct{}{}
		wg.Add(1)
		id := strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(kernrpc.WithMetadata(context.Background(), kernel.Metadata{idKey: id}), r.deadline)
		start := time.Now()
		resp := new(wrapperspb.StringValue)
		done := func(err error) {
			tl.outcome(r, i, time.Since(start), resp, err)
			cancel()
			<-sem
			wg.Done()
		}
		req := wrapperspb.String(payload(id))
		switch i % 3 {
		case 0:
			go func() { done(cli.Call(ctx, method, req, resp)) }()
		case 1:
			call := cli.Go(ctx, method, req, resp, nil)
			go func() { done((<-call.Done).Err) }()
		default:
			cli.CallFunc(ctx, method, req, resp, func(c *kernrpc.Call) { done(c.Err) })
		}
	}
	wg.Wait()
}

// check holds every call to its contract.
func (r *run) check(t *testing.T, tl *tally) {
	t.Helper()
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for i := range tl.outcomes {
		if n := tl.outcomes[i].Load(); n != 1 {
			report("call %d had %d outcomes; want exactly one", i, n)
		}
		if n := tl.execs(strconv.Itoa(i)); n > 1 {
			report("call %d ran %d times on the server; the engine may resend only calls the server did not process", i, n)
		}
	}
	if tl.maxOver > margin {
		report("a call ended %s past its %s deadline; want at most %s", tl.maxOver, r.deadline, margin)
	}
	// A garbling fault may alter a request's id on its way, so that the
	// server counts its execution as garbled: no more successes than that
	// go unaccounted for.
	if n := tl.unexecuted; n > 0 && (!r.garbles || n > int(tl.garbled.Load())) {
		report("%d calls succeeded with no execution on the server to account for them (%d garbled executions)", n, tl.garbled.Load())
	}
	if tl.altered > 0 && !r.garbles {
		report("%d calls were answered with another call's answer", tl.altered)
	}
	if tl.garbled.Load() > 0 && !r.garbles {
		report("the server ran %d requests whose payload was not their call's", tl.garbled.Load())
	}
	if bad > 10 {
		t.Errorf("... and %d more", bad-10)
	}
}

// openFDs counts this process's open file descriptors: sockets, and for
// shm-ring the segments' memfds.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// fdsBackTo waits, briefly, for the descriptors to fall back to base:
// closed connections release theirs asynchronously.
func fdsBackTo(base int) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return err
		}
		if len(ents) <= base {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("file descriptors: " + strconv.Itoa(len(ents)) + " open after the run, " + strconv.Itoa(base) + " before")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
