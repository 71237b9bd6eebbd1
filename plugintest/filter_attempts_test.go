package plugintest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// The filters the new contract allows, each doing what a broken filter
// below gets wrong: they must pass, or the suite cries wolf.
func TestFilterPassesFiltersThatAnswerRetryOrHedge(t *testing.T) {
	t.Run("cache", func(t *testing.T) {
		var hits atomic.Int32
		rec := filterRecord(t, filterFactoryOf(func() kernel.Filter { return &filterCache{hits: &hits} }), FilterConfig{})
		codecExpectClean(t, rec)
		if hits.Load() == 0 {
			t.Error("the cache never answered by itself, so the suite did not show it honours that")
		}
	})
	t.Run("answers every call by itself", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			return "the fallback", nil
		}), FilterConfig{})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Response"); !strings.Contains(why, "by itself") {
			t.Errorf("Filter/Response on a filter that answers every call: skip reason %q, want one saying it answered by itself", why)
		}
	})
	t.Run("retry", func(t *testing.T) {
		var retries atomic.Int32
		rec := filterRecord(t, filterFuncFactory(filterRetry(&retries)), FilterConfig{Side: kernel.ClientSide})
		codecExpectClean(t, rec)
		if retries.Load() == 0 {
			t.Error("the retry never retried, so the suite did not show it allows a second attempt")
		}
	})
	t.Run("hedge", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(filterHedge(false, false)), FilterConfig{Side: kernel.ClientSide})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Attempts"); why != "" {
			t.Errorf("Filter/Attempts skipped for a hedge: %s", why)
		}
	})
}

func TestFilterCatchesBrokenAttempts(t *testing.T) {
	release := make(chan struct{}) // ends the calls the hanging filters hold
	defer close(release)
	cases := []struct {
		name   string
		filter kernel.FilterFunc
		cfg    FilterConfig
		path   string
		msg    string // in the failure's message
	}{
		{"hedges with one CallInfo for both attempts", filterHedge(true, false),
			FilterConfig{Side: kernel.ClientSide}, "Filter/Attempts/Client", "same *kernel.CallInfo"},
		{"returns one attempt's response with another's response metadata", filterHedge(false, true),
			FilterConfig{Side: kernel.ClientSide}, "Filter/Attempts/Client", "not a mix of attempts"},
		{"writes into nil request metadata", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			info.Metadata["trace-id"] = "1"
			return next(ctx, info, req)
		}, FilterConfig{}, "Filter/NilMetadata", "info.SetRequestMetadata"},
		{"calls next from a goroutine after returning", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			go func() {
				time.Sleep(filterLateWindow / 5)
				next(ctx, info, req) // a retry in the background
			}()
			return resp, err
		}, FilterConfig{}, "Filter/AfterReturn", "next was called after Invoke returned"},
		{"formats the request from a goroutine after returning", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			go func() {
				time.Sleep(filterLateWindow / 5)
				_ = fmt.Sprint(req) // an asynchronous access log
			}()
			return next(ctx, info, req)
		}, FilterConfig{}, "Filter/AfterReturn", "String method"},
		{"declares RejectsEveryCall but lets calls through", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(ctx, info, req)
		}, FilterConfig{RejectsEveryCall: true}, "Filter/RejectsEveryCall", "RejectsEveryCall is set"},
		{"declares RejectsEveryCall but answers calls itself", func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			return &filterResp{id: "maintenance page"}, nil
		}, FilterConfig{RejectsEveryCall: true}, "Filter/RejectsEveryCall", "an answer is no rejection"},
		{"hangs, ignoring its context", func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			<-release
			return nil, kernel.Errorf(kernel.Unavailable, "released")
		}, FilterConfig{Side: kernel.ClientSide, Patience: 100 * time.Millisecond}, "Filter/Outcome", "did not return within 100ms"},
		{"hangs on a call without metadata", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if info.Metadata == nil {
				<-release
			}
			return next(ctx, info, req)
		}, FilterConfig{Side: kernel.ServerSide, Patience: 100 * time.Millisecond}, "Filter/NilMetadata", "nil request metadata: Invoke on the server side did not return"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, filterFuncFactory(tc.filter), tc.cfg)
			expectCaught(t, rec, tc.path)
			expectMessage(t, rec, tc.path, tc.msg)
		})
	}
}

// A filter that rejects every call, though its FilterConfig should let
// calls through, must fail every check of what it passes on: skipped, those
// checks would certify it unchecked.
func TestFilterFailsAFilterThatRejectsEveryCall(t *testing.T) {
	rec := filterRecord(t, filterFuncFactory(filterDenyAll), FilterConfig{})
	for _, path := range []string{
		"Filter/RequestMetadata", "Filter/ResponseMetadata", "Filter/Response", "Filter/Error",
		"Filter/CancelledContext/During", "Filter/Concurrent", "Filter/Attempts/Client", "Filter/NilMetadata",
	} {
		expectCaught(t, rec, path)
		if why := rec.skippedUnder(path); why != "" {
			t.Errorf("%s skipped (%s) for a filter rejecting calls its config should let through; it must fail", path, why)
		}
	}
	expectMessage(t, rec, "Filter/Response", "FilterConfig.Metadata")
	expectMessage(t, rec, "Filter/Response", "nobody may call")
	for _, path := range []string{"Filter/Outcome", "Filter/CancelledContext/Before", "Filter/AfterReturn"} {
		if rec.failedUnder(path) {
			t.Errorf("%s failed a rejection, which it must accept", path)
		}
	}
}

// filterFactoryOf builds a fresh filter for every Build, taking no options.
func filterFactoryOf(newFilter func() kernel.Filter) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{
		Name: "good",
		New:  func(any) (kernel.Filter, error) { return newFilter(), nil },
	}
}

// filterCache answers a method it has seen succeed with the response it
// got then, without calling next.
type filterCache struct {
	hits *atomic.Int32
	mu   sync.Mutex
	seen map[string]any
}

func (f *filterCache) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	f.mu.Lock()
	resp, hit := f.seen[info.Method]
	f.mu.Unlock()
	if hit {
		f.hits.Add(1)
		return resp, nil
	}
	resp, err := next(ctx, info, req)
	if err == nil {
		f.mu.Lock()
		if f.seen == nil {
			f.seen = make(map[string]any)
		}
		f.seen[info.Method] = resp
		f.mu.Unlock()
	}
	return resp, err
}

// filterRetry makes a second attempt, with the same CallInfo, when the
// first failed as retryable.
func filterRetry(retries *atomic.Int32) kernel.FilterFunc {
	return func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
		resp, err := next(ctx, info, req)
		if err != nil && kernel.IsRetryable(err) && ctx.Err() == nil {
			retries.Add(1)
			return next(ctx, info, req)
		}
		return resp, err
	}
}

// filterHedge makes two attempts at once and returns the first success,
// cancelling the other and waiting for it, so that no attempt outlives
// Invoke. Its two bugs, each a flag: shareInfo gives both attempts the
// caller's CallInfo; wrongMetadata gives the caller the response
// metadata of the attempt whose response it does not return.
func filterHedge(shareInfo, wrongMetadata bool) kernel.FilterFunc {
	return func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			resp any
			err  error
			info *kernel.CallInfo
		}
		results := make(chan result, 2)
		var wg sync.WaitGroup
		for range 2 {
			ci := info
			if !shareInfo {
				copied := *info
				ci = &copied
			}
			wg.Go(func() {
				resp, err := next(ctx, ci, req)
				results <- result{resp, err, ci}
			})
		}
		var got []result
		for range 2 {
			r := <-results
			got = append(got, r)
			if r.err == nil {
				break
			}
		}
		cancel()
		wg.Wait()
		won := got[len(got)-1]
		if won.err != nil {
			return nil, won.err
		}
		from := won
		if wrongMetadata {
			from = got[0] // the loser, if the first answer failed
			if len(got) == 1 {
				from = <-results
			}
		}
		if !shareInfo {
			info.Instance, info.Peer, info.Attempt, info.ResponseMetadata = from.info.Instance, from.info.Peer, from.info.Attempt, from.info.ResponseMetadata
		}
		return won.resp, nil
	}
}
