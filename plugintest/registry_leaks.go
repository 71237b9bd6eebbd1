package plugintest

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// goroutineTree follows the goroutines one goroutine (the root) started,
// directly or through goroutines it started, so that a leak check blames
// a plugin only for goroutines its own calls started: other tests running
// in parallel start goroutines too, which a count would blame it for.
// Each snapshot learns who created whom from the stack traces' "created by
// ... in goroutine N" lines; take one after each step that may start
// goroutines, since a goroutine that ended takes its children's ancestry
// with it.
type goroutineTree struct {
	root   int64
	mu     sync.Mutex
	parent map[int64]int64
	size   atomic.Int64 // of the last dump of every stack, where the next starts
}

func newGoroutineTree() *goroutineTree {
	g := &goroutineTree{root: currentGoroutine(), parent: make(map[int64]int64)}
	g.snapshot()
	return g
}

// snapshot records the live goroutines' parents and returns their stacks.
func (g *goroutineTree) snapshot() map[int64]string {
	// Each try stops the world: start where the last dump ended, with room
	// to grow, rather than doubling up to it every time.
	buf := make([]byte, max(64<<10, g.size.Load()*5/4))
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	g.size.Store(int64(len(buf)))
	g.mu.Lock()
	defer g.mu.Unlock()
	live := make(map[int64]string)
	for _, block := range bytes.Split(buf, []byte("\n\n")) {
		id, ok := goroutineID(block)
		if !ok {
			continue
		}
		live[id] = string(block)
		if i := bytes.LastIndex(block, []byte(" in goroutine ")); i >= 0 {
			rest := block[i+len(" in goroutine "):]
			if j := bytes.IndexByte(rest, '\n'); j >= 0 {
				rest = rest[:j]
			}
			if p, err := strconv.ParseInt(string(rest), 10, 64); err == nil {
				g.parent[id] = p
			}
		}
	}
	return live
}

// descendants returns the stacks of the live goroutines the root started,
// directly or not.
func (g *goroutineTree) descendants() []string {
	var out []string
	live := g.snapshot()
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, stack := range live {
		if id == g.root {
			continue
		}
		for p, ok := g.parent[id]; ok; p, ok = g.parent[p] {
			if p == g.root {
				out = append(out, stack)
				break
			}
		}
	}
	return out
}

// await waits up to d for the root's descendants to end and returns those
// still running. The last look starts after d has passed: a snapshot can
// take most of a second on a busy machine, and one begun before the end
// would blame goroutines for ending while it ran.
func (g *goroutineTree) await(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		last := !time.Now().Before(deadline)
		left := g.descendants()
		if len(left) == 0 || last {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func goroutineID(stack []byte) (int64, bool) {
	rest, ok := bytes.CutPrefix(stack, []byte("goroutine "))
	if !ok {
		return 0, false
	}
	if i := bytes.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	id, err := strconv.ParseInt(string(rest), 10, 64)
	return id, err == nil
}

func currentGoroutine() int64 {
	var buf [64]byte
	id, _ := goroutineID(buf[:runtime.Stack(buf[:], false)])
	return id
}

// registryLeaks drives two registries through what a client and a server
// do, failures and cancellations included, closes them, and expects every
// goroutine their calls started to end.
func (s registryRun) leaks(t tb) {
	tolerance := s.cfg.tolerance()
	tree := newGoroutineTree()
	func() {
		ctx := registryContext(t)
		r1, r2 := build(t, s.f, s.cfg.Options), build(t, s.f, s.cfg.Options)
		defer r1.Close()
		defer r2.Close()
		tree.snapshot()
		service := registryService(t)
		a, b, c := registryInstance(service, "a"), registryInstance(service, "b"), registryInstance(service, "c")
		s.register(t, r1, a, registryLongTTL)
		s.register(t, r2, b, 0)
		tree.snapshot()

		// A watcher that reads, then stops reading while a change is on
		// its way, and cancels: what a client does when it closes.
		wctx, cancelW := context.WithCancel(ctx)
		defer cancelW()
		ch := s.watch(t, wctx, r1, service)
		registryAwait(t, ch, tolerance, "current set", []kernel.Instance{a, b})
		s.register(t, r2, c, registryLongTTL)
		time.Sleep(20 * time.Millisecond) // let the change reach the watch
		tree.snapshot()
		cancelW()

		// A watch whose ctx was done before Watch was called.
		dead, kill := context.WithCancel(ctx)
		kill()
		if ch, err := registryCall(t, tree, tolerance, "Watch with a cancelled ctx", func() (<-chan []kernel.Instance, error) {
			return r2.Watch(dead, service)
		}); err == nil {
			tree.snapshot()
			registryClosed(t, ch, tolerance, "Watch with a ctx cancelled before the call returned no error, and its channel")
		}

		// A watch cancelled while its reader waits for the next set.
		w3, cancel3 := context.WithCancel(ctx)
		ch3 := s.watch(t, w3, r2, service)
		registryAwait(t, ch3, tolerance, "current set", []kernel.Instance{a, b, c})
		tree.snapshot()
		cancel3()
		registryClosed(t, ch3, tolerance, "a watch cancelled while its reader waited")

		// A watch still open when its registry closes, and calls on a
		// closed registry: each may fail, none may start what outlives it.
		w4, cancel4 := context.WithCancel(ctx)
		defer cancel4()
		s.watch(t, w4, r1, service)
		s.deregister(t, r1, a)
		tree.snapshot()
		if err := r1.Close(); err != nil {
			t.Errorf("Close: %v; want nil", err)
		}
		tree.snapshot()
		registryCall(t, tree, tolerance, "Resolve after Close", func() ([]kernel.Instance, error) { return r1.Resolve(ctx, service) })
		registryCall(t, tree, tolerance, "Register after Close", func() (struct{}, error) {
			return struct{}{}, r1.Register(ctx, registryInstance(service, "late"), registryLongTTL)
		})
		w5, cancel5 := context.WithCancel(ctx)
		if ch, err := registryCall(t, tree, tolerance, "Watch after Close", func() (<-chan []kernel.Instance, error) {
			return r1.Watch(w5, service)
		}); err == nil && ch != nil {
			tree.snapshot()
			cancel5()
			registryClosed(t, ch, tolerance, "Watch after Close returned no error, and its channel, once its ctx was cancelled,")
		}
		cancel5()
		cancel4()
		tree.snapshot()
	}()
	if left := tree.await(tolerance); len(left) > 0 {
		t.Errorf("%d goroutines started by the registries' calls still run %s after both registries were closed and every "+
			"watch's ctx cancelled; a watch must end its goroutines when its ctx is done (also when nobody reads its channel "+
			"any more), and Close must stop the rest:\n%s", len(left), tolerance, registryStacks(left))
	}
}

// registryCall runs f, a call on a registry, failing t if it panics or
// does not return within d; a hung call is left behind. f runs on a
// goroutine of its own, which takes a snapshot of tree (if any) before it
// ends, so that what f started stays traced to tree's root. It reports
// f's result first: a snapshot stops the world to read every stack, and
// with many suites running at once on a busy machine one took 0.9s,
// which d is not meant to time.
func registryCall[T any](t tb, tree *goroutineTree, d time.Duration, what string, f func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
		p   any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.p = p
			}
			done <- r
			if tree != nil {
				tree.snapshot()
			}
		}()
		r.v, r.err = f()
	}()
	select {
	case r := <-done:
		if r.p != nil {
			t.Errorf("%s panicked: %v; return an error (wrapping kernel.ErrClosed after Close)", what, r.p)
			return r.v, fmt.Errorf("panicked")
		}
		return r.v, r.err
	case <-time.After(d):
		t.Errorf("%s did not return within %s", what, d)
		var zero T
		return zero, fmt.Errorf("hung")
	}
}

// registryClosed drains ch and fails t unless it closes within d.
func registryClosed(t tb, ch <-chan []kernel.Instance, d time.Duration, what string) {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout.C:
			t.Errorf("%s is still open %s later; Watch must close its channel once its ctx is done", what, d)
			return
		}
	}
}

// registryStacks prints at most a few stacks, each cut short.
func registryStacks(stacks []string) string {
	const shown, lines = 4, 12
	var b strings.Builder
	for i, s := range stacks {
		if i == shown {
			fmt.Fprintf(&b, "... and %d more\n", len(stacks)-shown)
			break
		}
		ls := strings.Split(s, "\n")
		if len(ls) > lines {
			ls = append(ls[:lines], "\t...")
		}
		b.WriteString(strings.Join(ls, "\n"))
		b.WriteString("\n\n")
	}
	return b.String()
}
