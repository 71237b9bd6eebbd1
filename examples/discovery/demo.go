package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

type options struct {
	duration, killAfter time.Duration
	callers             int
}

// report is what the demo saw, for its test.
type report struct {
	calls, failed int
	firstErr      error
	// perServer counts answers by server, before the kill and after the
	// registry dropped the killed server.
	before, after map[string]int
	killed        string
	// gone is how long after the kill the registry stopped listing the
	// killed server; ttl is the registration's lease; lastAnswer is when,
	// after the kill, the killed server last answered (0: never).
	gone, ttl, lastAnswer time.Duration
}

var names = []string{"alpha", "beta", "gamma"}

// check refuses options under which the demo cannot show a failover: no
// caller, no time to call, or a kill that comes after the calls end.
func (o options) check() error {
	if o.duration <= 0 || o.callers <= 0 || o.killAfter <= 0 {
		return fmt.Errorf("-duration %s, -callers %d and -kill-after %s must be positive", o.duration, o.callers, o.killAfter)
	}
	if o.killAfter >= o.duration {
		return fmt.Errorf("-kill-after %s is not before the end of -duration %s: no server would be killed while the calls run", o.killAfter, o.duration)
	}
	return nil
}

func run(ctx context.Context, out io.Writer, o options) (*report, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kernrpc-discovery-etcd")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(out, "starting an embedded etcd")
	e, endpoint, err := startEtcd(dir)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	cfg, err := loadConfig(endpoint)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "etcd serves on %s; starting %d echo servers, each a process of its own\n", endpoint, len(names))
	var children []*child
	defer func() {
		for _, c := range children {
			c.stop(cfg.Server.ShutdownTimeout.D())
		}
	}()
	for _, name := range names {
		c, err := startChild(ctx, endpoint, name)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
		fmt.Fprintf(out, "  server %s on %s (pid %d)\n", name, c.addr, c.cmd.Process.Pid)
	}
	reg, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, configSource)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	watch, err := watchInstances(ctx, reg, cfg.Service)
	if err != nil {
		return nil, err
	}
	if err := watch.waitFor(ctx, len(names), 10*time.Second); err != nil {
		return nil, err
	}
	cli, err := kernrpc.NewClient(cfg, "")
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	fmt.Fprintf(out, "etcd lists all %d; %d callers call for %s through balancer %s, retry filter on; server %s is killed after %s\n",
		len(names), o.callers, o.duration, cfg.Balancer.Name, names[1], o.killAfter)
	rep := &report{killed: names[1], ttl: cfg.Server.RegisterTTL.D(), before: map[string]int{}, after: map[string]int{}}
	tally := newTally()
	cctx, stopCalls := context.WithTimeout(ctx, o.duration)
	defer stopCalls()
	var wg sync.WaitGroup
	for range o.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			callLoop(cctx, cli, tally)
		}()
	}
	killAt := time.Now().Add(o.killAfter)
	gone := make(chan time.Duration, 1)
	go func() {
		if d, ok := watch.waitGone(cctx, rep.killed, killAt); ok {
			gone <- d
		}
	}()
	progress(cctx, out, tally, killAt, func() {
		_ = children[1].cmd.Process.Kill()
		fmt.Fprintf(out, "  killed server %s (SIGKILL); its lease lapses within %s\n", rep.killed, rep.ttl)
	}, gone, rep)
	wg.Wait()
	rep.calls, rep.failed, rep.firstErr = tally.totals()
	rep.before, rep.after = tally.phases()
	if last := tally.lastFrom(rep.killed); last.After(killAt) {
		rep.lastAnswer = last.Sub(killAt)
	}
	if ctx.Err() != nil {
		// The calls stopped early, perhaps before the kill: a summary
		// would claim a failover the run did not show.
		return rep, fmt.Errorf("interrupted after %d calls: no verdict", rep.calls)
	}
	printSummary(out, rep)
	return rep, nil
}

func callLoop(ctx context.Context, cli *kernrpc.Client, t *tally) {
	var resp wrapperspb.StringValue
	req := wrapperspb.String("who?")
	end, _ := ctx.Deadline()
	for ctx.Err() == nil {
		err := cli.Call(ctx, "Echo.Who", req, &resp)
		if ctx.Err() != nil || !time.Now().Before(end) {
			return // the run ended under this call: not a failure
		}
		t.add(resp.GetValue(), err)
	}
}

// progress prints a line a second, kills the server at killAt, and notes
// when the registry dropped it.
func progress(ctx context.Context, out io.Writer, t *tally, killAt time.Time, kill func(), gone <-chan time.Duration, rep *report) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	killTimer := time.NewTimer(time.Until(killAt))
	defer killTimer.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-killTimer.C:
			kill()
			t.setPhase(phaseKilled)
		case d := <-gone:
			rep.gone = d
			t.setPhase(phaseAfter)
			fmt.Fprintf(out, "  etcd dropped server %s %s after the kill\n", rep.killed, d.Round(time.Millisecond))
		case <-tick.C:
			fmt.Fprintf(out, "t=%2ds  %s\n", int(time.Since(start).Round(time.Second).Seconds()), t.second())
		}
	}
}

func printSummary(out io.Writer, rep *report) {
	fmt.Fprintf(out, "\n%d calls, %d failed", rep.calls, rep.failed)
	if rep.firstErr != nil {
		fmt.Fprintf(out, " (first: %v)", rep.firstErr)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%-8s %14s %22s\n", "server", "before the kill", "after etcd dropped it")
	for _, n := range names {
		fmt.Fprintf(out, "%-8s %14d %22d\n", n, rep.before[n], rep.after[n])
	}
	if rep.lastAnswer > 0 {
		fmt.Fprintf(out, "failover: %s answered its last call %s after the kill", rep.killed, rep.lastAnswer.Round(time.Millisecond))
	} else {
		fmt.Fprintf(out, "failover: %s answered no call after the kill; every call went to the others", rep.killed)
	}
	if rep.gone > 0 {
		fmt.Fprintf(out, ", and etcd stopped listing it %s after the kill (TTL %s, checked by etcd every 500ms)", rep.gone.Round(time.Millisecond), rep.ttl)
	}
	fmt.Fprintln(out)
}

type phase int

const (
	phaseBefore phase = iota
	phaseKilled       // killed, still listed
	phaseAfter        // dropped by the registry
)

// tally counts answers by server and phase, and failures.
type tally struct {
	mu         sync.Mutex
	phase      phase
	byPhase    [3]map[string]int
	thisSecond map[string]int
	last       map[string]time.Time // each server's latest answer
	calls      int
	failed     int
	firstErr   error
}

func newTally() *tally {
	t := &tally{thisSecond: map[string]int{}, last: map[string]time.Time{}}
	for i := range t.byPhase {
		t.byPhase[i] = map[string]int{}
	}
	return t
}

func (t *tally) add(server string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	if err != nil {
		t.failed++
		t.thisSecond["failed"]++
		if t.firstErr == nil {
			t.firstErr = err
		}
		return
	}
	t.byPhase[t.phase][server]++
	t.thisSecond[server]++
	t.last[server] = time.Now()
}

func (t *tally) lastFrom(server string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last[server]
}

func (t *tally) setPhase(p phase) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phase = max(t.phase, p)
}

// second describes the calls since the last call of second and resets.
func (t *tally) second() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	total := 0
	for _, n := range names {
		total += t.thisSecond[n]
	}
	fmt.Fprintf(&b, "%6d calls/s", total)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s %5d", n, t.thisSecond[n])
	}
	fmt.Fprintf(&b, "  failed %d", t.thisSecond["failed"])
	clear(t.thisSecond)
	return b.String()
}

func (t *tally) totals() (int, int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls, t.failed, t.firstErr
}

func (t *tally) phases() (before, after map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byPhase[phaseBefore], t.byPhase[phaseAfter]
}

// instances follows what the registry lists.
type instances struct {
	mu      sync.Mutex
	ids     []string
	changed chan struct{}
}

func watchInstances(ctx context.Context, reg kernel.Registry, service string) (*instances, error) {
	sets, err := reg.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	w := &instances{changed: make(chan struct{})}
	go func() {
		for set := range sets {
			ids := make([]string, 0, len(set))
			for _, in := range set {
				ids = append(ids, in.ID)
			}
			w.mu.Lock()
			w.ids = ids
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func (w *instances) snapshot() ([]string, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ids, w.changed
}

func (w *instances) waitFor(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		ids, changed := w.snapshot()
		if len(ids) == n {
			return nil
		}
		select {
		case <-changed:
		case <-deadline:
			return fmt.Errorf("the registry lists %v after %s, want %d instances", ids, timeout, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitGone waits until id is no longer listed after killAt, and says how
// long after killAt that was.
func (w *instances) waitGone(ctx context.Context, id string, killAt time.Time) (time.Duration, bool) {
	for {
		ids, changed := w.snapshot()
		if !slices.Contains(ids, id) && time.Now().After(killAt) {
			return time.Since(killAt), true
		}
		var untilKill <-chan time.Time
		if wait := time.Until(killAt); wait > 0 {
			untilKill = time.After(wait)
		}
		select {
		case <-changed:
		case <-untilKill:
		case <-ctx.Done():
			return 0, false
		}
	}
}
