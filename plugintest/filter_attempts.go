package plugintest

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

const (
	// filterOverlap is how long the first attempt waits for another to
	// start: long enough that a hedge's attempts overlap even on a loaded
	// machine, short enough to spend on every filter that makes one.
	filterOverlap = 50 * time.Millisecond
	// filterLateWindow is how long the suite watches a filter after Invoke
	// returned, for uses of what it must not keep.
	filterLateWindow = 50 * time.Millisecond
	filterAttemptKey = "plugintest-attempt"
	filterPoison     = "plugintest: reused for another call"
)

func filterAttempts(t tb, e *filterEnv) {
	if e.side == kernel.ServerSide {
		filterServerAttempts(t, e)
		return
	}
	info := e.info()
	info.Metadata["plugintest-a"] = "alpha"
	want := info.Metadata.Clone()

	type attempt struct {
		n        int
		method   string
		metadata kernel.Metadata
	}
	var (
		mu       sync.Mutex
		attempts []attempt
		resps    = map[*filterResp]int{} // each attempt's response → its number
		returned bool                    // Invoke returned: attempts still running write nothing
		peer     = make(chan struct{})
		peerOnce sync.Once
	)
	// The first attempt fails, as a retryable Unavailable, once another has
	// started or filterOverlap has passed, so that a retry makes a second
	// attempt and a hedge's two attempts overlap; the others succeed at
	// once. Each answer's metadata names its attempt, as a real answer's
	// would be its server's, so that the caller can be seen to get one
	// attempt's response with that attempt's metadata.
	next := func(ctx context.Context, got *kernel.CallInfo, _ any) (any, error) {
		mu.Lock()
		n := len(attempts) + 1
		attempts = append(attempts, attempt{n, got.Method, got.Metadata.Clone()})
		mu.Unlock()
		var resp *filterResp
		var err error
		if n == 1 {
			select {
			case <-peer:
			case <-ctx.Done():
			case <-time.After(filterOverlap):
			}
			err = &kernel.Status{Code: kernel.Unavailable, Retryable: true, Message: "plugintest: attempt 1 failed; another may succeed"}
		} else {
			peerOnce.Do(func() { close(peer) })
			resp = &filterResp{id: "attempt " + strconv.Itoa(n)}
		}
		mu.Lock()
		defer mu.Unlock()
		if !returned {
			got.Attempt = n
			got.ResponseMetadata = kernel.Metadata{filterAttemptKey: strconv.Itoa(n)}
			if resp != nil {
				resps[resp] = n
			}
		}
		if resp == nil {
			return nil, err
		}
		return resp, nil
	}
	o, ok := e.invoke(t, t.Context(), info, next)
	mu.Lock()
	returned = true
	mu.Unlock()
	if !ok || !e.reachedNext(t, o) {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range attempts {
		for k, v := range want {
			if a.metadata[k] != v {
				t.Errorf("attempt %d of %d reached next with request metadata %q = %q, want %q; every attempt carries the caller's metadata",
					a.n, len(attempts), k, a.metadata[k], v)
			}
		}
		if a.method != filterMethod {
			t.Errorf("attempt %d of %d reached next for method %q, want %q", a.n, len(attempts), a.method, filterMethod)
		}
	}
	if o.err != nil {
		return
	}
	r, _ := o.resp.(*filterResp)
	n, fromNext := resps[r]
	if !fromNext {
		return // a response of the filter's own, with whatever metadata it chose
	}
	if got := info.ResponseMetadata[filterAttemptKey]; got != strconv.Itoa(n) {
		from := "attempt " + got
		if got == "" {
			from = "no attempt"
		}
		t.Errorf("the caller got attempt %d's response with the response metadata of %s (of %d attempts); "+
			"a filter returning one attempt's response must give the caller that attempt's ResponseMetadata "+
			"(copy it back from the CallInfo that attempt was given), not a mix of attempts", n, from, len(attempts))
	}
}

// filterServerAttempts: on the server, next is the handler, and a second
// call of it runs the handler, side effects and all, a second time.
func filterServerAttempts(t tb, e *filterEnv) {
	o, ok := e.invoke(t, t.Context(), e.info(), freshNext("handled"))
	if ok && o.nexts > 1 {
		t.Errorf("the filter called next %d times for one call on the server, where next is the handler; "+
			"only a client filter may make several attempts", o.nexts)
	}
}

// filterAfterReturn overwrites the CallInfo once Invoke returns, as the
// kernel reuses it for another call, and watches the filter a while. A
// late call of next or a late String of the request it sees itself; a late
// read of the CallInfo races with the overwrite, which -race reports.
func filterAfterReturn(t tb, e *filterEnv) {
	info := e.info()
	o, ok := e.invoke(t, t.Context(), info, freshNext("before return"))
	if !ok {
		return
	}
	watchAfterReturn(t, info, "Invoke", o.call.report)
}

// watchAfterReturn overwrites info, whose call's Invoke or InvokeStream
// (named by returned) has returned, as the kernel does when it reuses it
// for another call, waits filterLateWindow, and fails t if the filter
// wrote into it meanwhile; report then says what else it did late.
func watchAfterReturn(t tb, info *kernel.CallInfo, returned string, report func(tb)) {
	poisonMD := kernel.Metadata{filterMDKey: filterPoison}
	poisonResp := kernel.Metadata{filterAttemptKey: filterPoison}
	info.Method, info.Peer, info.Codec = filterPoison, filterPoison, filterPoison
	info.Metadata, info.ResponseMetadata = poisonMD, poisonResp
	info.Instance, info.Attempt = nil, -1
	time.Sleep(filterLateWindow)
	report(t)
	if info.Method != filterPoison || info.Peer != filterPoison || info.Codec != filterPoison ||
		info.Instance != nil || info.Attempt != -1 ||
		len(info.Metadata) != 1 || info.Metadata[filterMDKey] != filterPoison ||
		len(info.ResponseMetadata) != 1 || info.ResponseMetadata[filterAttemptKey] != filterPoison {
		t.Errorf("the filter wrote into the CallInfo after %s returned, when it belongs to another call: "+
			"finish with info before returning", returned)
	}
}
