package plugintest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// slotFilter is a server filter that admits a call while fewer than limit
// hold a slot. take says where a call takes its slot, give where it gives
// it back; the broken ones leave some ending without a give.
type slotFilter struct {
	slotDesign
	held atomic.Int64
}

type slotDesign struct {
	limit  int64
	inAdm  bool // Admit takes the slot (else Invoke does)
	defers bool // Invoke gives it back in a defer (else only when next succeeds)
	ended  bool // CallEnded gives it back, for every call (a kernel.CallObserver)
}

func (f *slotFilter) Side() kernel.Side { return kernel.ServerSide }

func (f *slotFilter) Admit(_ context.Context, info *kernel.CallInfo) error {
	if f.held.Load() >= f.limit {
		return kernel.Errorf(kernel.ResourceExhausted, "slots: %d calls hold a slot", f.limit)
	}
	if f.inAdm {
		f.held.Add(1)
	}
	return nil
}

func (f *slotFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if !f.inAdm {
		f.held.Add(1)
	}
	if f.ended {
		return next(ctx, info, req)
	}
	if f.defers {
		defer f.held.Add(-1)
		return next(ctx, info, req)
	}
	resp, err := next(ctx, info, req)
	if err == nil {
		f.held.Add(-1)
	}
	return resp, err
}

// bucketFilter is a rate limit whose bucket never refills: Admit takes a
// token that no call's end gives back, as time would.
type bucketFilter struct{ left atomic.Int64 }

func (*bucketFilter) Side() kernel.Side { return kernel.ServerSide }

func (f *bucketFilter) Admit(context.Context, *kernel.CallInfo) error {
	if f.left.Add(-1) < 0 {
		return kernel.Errorf(kernel.ResourceExhausted, "bucket: empty")
	}
	return nil
}

func (*bucketFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

// observedSlotFilter gives the slot back in CallEnded.
type observedSlotFilter struct{ *slotFilter }

func (f observedSlotFilter) CallEnded(*kernel.CallInfo, error, bool) { f.held.Add(-1) }

func slotFactory(d slotDesign) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{Name: "slots", New: func(any) (kernel.Filter, error) {
		g := &slotFilter{slotDesign: d}
		if g.ended {
			return observedSlotFilter{g}, nil
		}
		return g, nil
	}}
}

// onlyUnder fails t for a failure of rec outside path: the broken filter
// must pass every other check.
func onlyUnder(t *testing.T, rec *recording, path string) {
	t.Helper()
	for _, f := range rec.failures {
		if f.path != path && !strings.HasPrefix(f.path, path+"/") {
			t.Errorf("the broken filter failed %s too, which it should pass: %s", f.path, f.msg)
		}
	}
}

// TestFilterChecksAdmitters: an Admitter that gives back what Admit took
// however the call ends passes Filter/Admitter; one that gives it back in
// Invoke only, or only when next succeeds, is caught for the endings that
// keep it; a rate limit is skipped, not failed.
func TestFilterChecksAdmitters(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    slotDesign
	}{
		{"takes in Invoke, gives back in a defer", slotDesign{limit: 8, defers: true}},
		{"takes in Admit, gives back in CallEnded", slotDesign{limit: 8, inAdm: true, ended: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, slotFactory(tc.f), FilterConfig{})
			codecExpectClean(t, rec)
			if why := rec.skippedUnder("Filter/Admitter"); why != "" {
				t.Errorf("Filter/Admitter skipped for an Admitter: %s", why)
			}
		})
	}
	t.Run("rate limit", func(t *testing.T) {
		rec := filterRecord(t, kernel.Factory[kernel.Filter]{Name: "bucket", New: func(any) (kernel.Filter, error) {
			b := &bucketFilter{}
			b.left.Store(5)
			return b, nil
		}}, FilterConfig{})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Admitter/BeforeInvoke"); !strings.Contains(why, "rate limit") {
			t.Errorf("Filter/Admitter/BeforeInvoke for a bucket that never refills: skip reason %q, want one naming a rate limit", why)
		}
	})
	cases := []struct {
		name   string
		f      slotDesign
		caught []string // the endings caught
		says   string
	}{
		// The slot is given back in Invoke, which a call refused by a
		// later Admitter, or whose request did not decode, never reaches.
		{"takes in Admit, gives back in Invoke", slotDesign{limit: 8, inAdm: true, defers: true},
			[]string{"BeforeInvoke"}, "Admit must not take anything that only Invoke gives back"},
		// The slot is given back after next, not in a defer, and only on
		// success.
		{"gives back only when next succeeds", slotDesign{limit: 8}, []string{"Error", "Panic", "Cancelled"},
			"give back what Admit took in a defer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, slotFactory(tc.f), FilterConfig{})
			for _, end := range tc.caught {
				expectCaught(t, rec, "Filter/Admitter/"+end)
				expectMessage(t, rec, "Filter/Admitter/"+end, tc.says)
			}
			expectMessage(t, rec, "Filter/Admitter", "admitted 8 calls in a row")
			for _, end := range filterEndings {
				if !slices.Contains(tc.caught, end.name) && rec.failedUnder("Filter/Admitter/"+end.name) {
					t.Errorf("Filter/Admitter/%s failed for a filter that gives the slot back when calls end that way", end.name)
				}
			}
			onlyUnder(t, rec, "Filter/Admitter")
		})
	}
}

// invokeStateObserver keeps each call's state from Invoke to CallEnded,
// by its CallInfo, as a metrics filter timing calls might. Its CallEnded
// counts on Invoke having run: wait says how it takes a call Invoke never
// saw (refused by an Admitter, a request that did not decode).
type invokeStateObserver struct {
	calls sync.Map // *kernel.CallInfo → *callState
	wait  bool     // wait for Invoke's state (else read it as if there)
	quit  chan struct{}
	once  sync.Once
}

// Close ends the waits, so that the test leaves no goroutine behind.
func (f *invokeStateObserver) Close() error { f.once.Do(func() { close(f.quit) }); return nil }

type callState struct{ done chan struct{} }

func (*invokeStateObserver) Side() kernel.Side { return kernel.ServerSide }

func (f *invokeStateObserver) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	st := &callState{done: make(chan struct{})}
	f.calls.Store(info, st)
	defer close(st.done)
	return next(ctx, info, req)
}

func (f *invokeStateObserver) CallEnded(info *kernel.CallInfo, _ error, _ bool) {
	v, _ := f.calls.LoadAndDelete(info)
	if f.wait {
		// Waits for a call Invoke never saw, until closed.
		var done chan struct{}
		if v != nil {
			done = v.(*callState).done
		}
		select {
		case <-done:
		case <-f.quit:
		}
		return
	}
	<-v.(*callState).done // a nil v: the call never went through Invoke
}

// TestFilterChecksCallObservers: a CallObserver whose CallEnded panics or
// blocks for a call Invoke never saw is caught by Filter/CallObserver, and
// passes every other check.
func TestFilterChecksCallObservers(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait bool
		says string
	}{
		{"panics for a call Invoke never saw", false, "panicked for a call answered before Invoke"},
		{"blocks for a call Invoke never saw", true, "did not return within 1s for a call answered before Invoke"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, kernel.Factory[kernel.Filter]{Name: "observer", New: func(any) (kernel.Filter, error) {
				return &invokeStateObserver{wait: tc.wait, quit: make(chan struct{})}, nil
			}}, FilterConfig{Patience: time.Second})
			expectCaught(t, rec, "Filter/CallObserver/Server")
			expectMessage(t, rec, "Filter/CallObserver", tc.says)
			onlyUnder(t, rec, "Filter/CallObserver")
		})
	}
}
