package plugintest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// recorder is a tb that records instead of failing, so that a test can run
// the suite against a broken plugin and assert which subtests failed.
type recorder struct {
	name   string // full path, "Suite/Sub/Leaf"
	parent *recorder
	root   *recording
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	failed   bool
	skipped  bool
	cleanups []func()
}

// recording is what one recorded suite run produced.
type recording struct {
	mu       sync.Mutex
	failures []failure // in the order they happened
	skips    []failure
	runs     []string // every subtest's path, in the order they started
}

type failure struct {
	path string // the subtest that failed
	msg  string
}

// record runs suite under a recorder rooted at name and returns what failed.
// The live test t is used only for logging.
func record(t *testing.T, name string, suite func(t tb)) *recording {
	t.Helper()
	rec := &recording{}
	root := newRecorder(name, nil, rec)
	root.runBody(suite)
	for _, f := range rec.failures {
		t.Logf("recorded failure (expected of a broken plugin): %s: %s", f.path, f.msg)
	}
	return rec
}

func newRecorder(name string, parent *recorder, rec *recording) *recorder {
	ctx, cancel := context.WithCancel(context.Background())
	return &recorder{name: name, parent: parent, root: rec, ctx: ctx, cancel: cancel}
}

// runBody runs f on its own goroutine, as testing does, so that Fatalf and
// Skipf can end it with runtime.Goexit.
func (r *recorder) runBody(f func(t tb)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.finish()
		defer func() {
			if p := recover(); p != nil {
				r.fail(fmt.Sprintf("panic: %v", p))
			}
		}()
		f(r)
	}()
	<-done
}

func (r *recorder) finish() {
	r.cancel()
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		r.runCleanup(cleanups[i])
	}
}

// runCleanup runs one cleanup, recording a panic as testing would report it.
func (r *recorder) runCleanup(f func()) {
	defer func() {
		if p := recover(); p != nil {
			r.fail(fmt.Sprintf("panic in cleanup: %v", p))
		}
	}()
	f()
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	for p := r.parent; p != nil; p = p.parent {
		p.mu.Lock()
		p.failed = true
		p.mu.Unlock()
	}
	r.root.mu.Lock()
	r.root.failures = append(r.root.failures, failure{r.name, msg})
	r.root.mu.Unlock()
}

func (r *recorder) Helper()                      {}
func (r *recorder) Name() string                 { return r.name }
func (r *recorder) Logf(format string, a ...any) {}
func (r *recorder) Context() context.Context     { return r.ctx }
func (r *recorder) Errorf(format string, a ...any) {
	r.fail(fmt.Sprintf(format, a...))
}
func (r *recorder) Fatalf(format string, a ...any) {
	r.fail(fmt.Sprintf(format, a...))
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, a ...any) {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	r.root.mu.Lock()
	r.root.skips = append(r.root.skips, failure{r.name, fmt.Sprintf(format, a...)})
	r.root.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}
func (r *recorder) TempDir() string {
	dir, err := os.MkdirTemp("", "plugintest")
	if err != nil {
		r.Fatalf("TempDir: %v", err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
func (r *recorder) Run(name string, f func(t tb)) bool {
	child := newRecorder(r.name+"/"+name, r, r.root)
	r.root.mu.Lock()
	r.root.runs = append(r.root.runs, child.name)
	r.root.mu.Unlock()
	child.runBody(f)
	return !child.Failed()
}

// paths returns the path of every subtest the suite ran.
func (rec *recording) paths() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.runs...)
}

// failedUnder reports whether a subtest at path, or below it, failed.
func (rec *recording) failedUnder(path string) bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, f := range rec.failures {
		if f.path == path || strings.HasPrefix(f.path, path+"/") {
			return true
		}
	}
	return false
}

// skippedUnder returns the reason a subtest at path, or below it, was
// skipped; "" if none was.
func (rec *recording) skippedUnder(path string) string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.skips {
		if s.path == path || strings.HasPrefix(s.path, path+"/") {
			return s.msg
		}
	}
	return ""
}

// expectCaught fails t unless the recorded suite failed the subtest at path:
// that is how a broken plugin shows the suite checks the property.
func expectCaught(t *testing.T, rec *recording, path string) {
	t.Helper()
	if !rec.failedUnder(path) {
		var got []string
		for _, f := range rec.failures {
			got = append(got, f.path)
		}
		t.Errorf("the suite did not catch the broken plugin in %s; failures recorded: %v", path, got)
	}
}

// expectMessage fails t unless a failure at or below path says want.
func expectMessage(t *testing.T, rec *recording, path, want string) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var got []string
	for _, f := range rec.failures {
		if f.path == path || strings.HasPrefix(f.path, path+"/") {
			if strings.Contains(f.msg, want) {
				return
			}
			got = append(got, f.msg)
		}
	}
	t.Errorf("no failure under %s says %q; got %q", path, want, got)
}
