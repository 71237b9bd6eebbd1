package plugintest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterForeignKey is a context key of the suite's own, which no filter
// can know: a ContextValuer must not answer it.
type filterForeignKey struct{ name string }

// filterForeignKeys are keys a handler's context may be asked for that
// belong to others: a struct key, as context keys usually are, and a
// plain string, as older code uses.
var filterForeignKeys = []any{filterForeignKey{"plugintest"}, "plugintest-context-key"}

// filterContextValuer holds a kernel.ContextValuer to what a handler's
// context asks of CallValue: the engine asks it for every key neither the
// handler's context nor one derived from it holds, before the server's
// base context, from any goroutine the handler starts. CallValue is
// called here as the handler would, from within next and from several
// goroutines at once, with keys of the suite's own: it must answer them
// ok false, since an answer hides the value the base context holds for
// the key from every handler, and it must neither panic nor block.
func filterContextValuer(t tb, e *filterEnv) {
	cv, ok := e.filter.(kernel.ContextValuer)
	switch {
	case !ok:
		t.Skipf("the filter does not implement kernel.ContextValuer")
	case e.side != kernel.ServerSide:
		t.Skipf("only a server's handler context asks CallValue")
	}
	const goroutines, callsEach = 4, 8
	var (
		mu       sync.Mutex
		problems []string
	)
	note := func(p string) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 3 && !slices.Contains(problems, p) {
			problems = append(problems, p)
		}
	}
	patience := e.patience()
	next := func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for i := range callsEach {
					key := filterForeignKeys[i%len(filterForeignKeys)]
					if p := filterCallValue(cv, info, key, patience); p != "" {
						note(p)
						return
					}
				}
			})
		}
		wg.Wait()
		return &filterResp{id: info.Metadata[filterMDKey]}, nil
	}
	if _, ok := e.passingCall(t, e.info(), next); !ok {
		return
	}
	for _, p := range problems {
		t.Errorf("%s", p)
	}
}

// filterCallValue asks cv for key on a goroutine of its own, so that a
// CallValue that panics or blocks is reported, and says what was wrong
// with the answer ("" if nothing).
func filterCallValue(cv kernel.ContextValuer, info *kernel.CallInfo, key any, patience time.Duration) string {
	type answer struct {
		val      any
		ok       bool
		panicked any
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		defer func() {
			a.panicked = recover()
			done <- a
		}()
		a.val, a.ok = cv.CallValue(info, key)
	}()
	select {
	case a := <-done:
		switch {
		case a.panicked != nil:
			return fmt.Sprintf("CallValue(info, %T %v) panicked: %v; the handler's context asks CallValue for every key it "+
				"does not hold itself, so CallValue must answer any key, ok false for those not its own", key, key, a.panicked)
		case a.ok:
			return fmt.Sprintf("CallValue(info, %T %v), a key of the suite's own that the filter cannot know, answered %#v, ok true; "+
				"the handler's context asks CallValue before the server's base context, so the handler would get this "+
				"instead of what the base context holds for the key: answer only keys of the filter's own", key, key, a.val)
		}
		return ""
	case <-time.After(patience):
		return fmt.Sprintf("CallValue(info, %T %v) did not return within %s; it runs on the handler's goroutines, so it must "+
			"be quick and must not block (kernel.ContextValuer)", key, key, patience)
	}
}
