package plugintest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterStampOptions configure filterStamp, the good filter the suite is
// checked against: it adds request metadata before next and response
// metadata after, as a tracing filter does.
type filterStampOptions struct {
	Key   string `json:"key"`
	Limit int    `json:"limit"`
}

type filterStamp struct{ key string }

func (f *filterStamp) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, kernel.StatusOf(err)
	}
	info.SetRequestMetadata(f.key, "stamped")
	resp, err := next(ctx, info, req)
	info.SetResponseMetadata(f.key, "seen")
	return resp, err
}

var filterStampFactory = kernel.NewFactory("stamp", "adds metadata both ways",
	func() *filterStampOptions { return &filterStampOptions{Key: "stamp", Limit: 1} },
	func(o *filterStampOptions) (kernel.Filter, error) {
		if o.Key == "" {
			return nil, errors.New(`option "key" is empty; name the metadata key to stamp`)
		}
		if o.Limit < 0 {
			return nil, fmt.Errorf(`option "limit" is %d; it must not be negative`, o.Limit)
		}
		return &filterStamp{key: o.Key}, nil
	})

// filterFuncFactory builds f for every Build, taking no options.
func filterFuncFactory(f kernel.FilterFunc) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{
		Name: "broken",
		New:  func(any) (kernel.Filter, error) { return f, nil },
	}
}

func filterRecord(t *testing.T, f kernel.Factory[kernel.Filter], cfg FilterConfig) *recording {
	t.Helper()
	return record(t, "Filter", func(t tb) { filterSuite(t, f, cfg) })
}

var filterStampConfig = FilterConfig{
	Options:       map[string]any{"key": "trace-id"},
	BadOptions:    map[string]any{"limit": -1},
	BadOptionsKey: "limit",
}

func TestFilterPassesGoodFilters(t *testing.T) {
	t.Run("stamp", func(t *testing.T) {
		rec := filterRecord(t, filterStampFactory, filterStampConfig)
		codecExpectClean(t, rec)
		for _, path := range []string{"Filter/Response", "Filter/Concurrent", "Filter/NilMetadata", "Filter/Attempts",
			"Filter/AfterReturn", "Filter/BadOptions", "Filter/Options/WrongType"} {
			if why := rec.skippedUnder(path); why != "" {
				t.Errorf("%s skipped for a filter that passes calls and has options: %s", path, why)
			}
		}
	})
	t.Run("pass-through", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(ctx, info, req)
		}), FilterConfig{})
		codecExpectClean(t, rec)
	})
	t.Run("deny-all, declared", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(filterDenyAll), FilterConfig{RejectsEveryCall: true})
		codecExpectClean(t, rec)
		for _, path := range []string{"Filter/Response/Client", "Filter/Concurrent/Server", "Filter/Attempts/Client"} {
			if why := rec.skippedUnder(path); !strings.Contains(why, "RejectsEveryCall") {
				t.Errorf("%s on a filter declared to reject every call: skip reason %q, want one naming FilterConfig.RejectsEveryCall", path, why)
			}
		}
		if why := rec.skippedUnder("Filter/RejectsEveryCall"); why != "" {
			t.Errorf("Filter/RejectsEveryCall skipped for a filter that declares it: %s", why)
		}
	})
	t.Run("requires metadata, given it", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if info.Metadata["token"] != "secret" {
				return nil, kernel.Errorf(kernel.Unauthenticated, "no token")
			}
			return next(ctx, info, req)
		}), FilterConfig{Metadata: kernel.Metadata{"token": "secret"}})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Response"); why != "" {
			t.Errorf("FilterConfig.Metadata did not let the suite's calls through: %s", why)
		}
	})
	t.Run("replaces the response", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if _, err := next(ctx, info, req); err != nil {
				return nil, err
			}
			return "a response of the filter's own", nil
		}), FilterConfig{})
		codecExpectClean(t, rec)
	})
	t.Run("falls back to a default value when next fails", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			if err != nil && ctx.Err() == nil {
				return &filterResp{id: "fallback"}, nil
			}
			return resp, err
		}), FilterConfig{})
		codecExpectClean(t, rec)
	})
	t.Run("answers a cancelled call from its cache", func(t *testing.T) {
		rec := filterRecord(t, filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if ctx.Err() != nil {
				return &filterResp{id: "cached"}, nil
			}
			return next(ctx, info, req)
		}), FilterConfig{})
		codecExpectClean(t, rec)
	})
}

func filterDenyAll(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
	return nil, kernel.Errorf(kernel.PermissionDenied, "nobody may call")
}

func TestFilterCatchesBrokenFilters(t *testing.T) {
	cases := []struct {
		name   string
		filter kernel.FilterFunc
		path   string
		side   kernel.Side // set where a check waits out its bound on a broken filter, to wait once
	}{
		{"answers (nil, nil) without calling next", func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			return nil, nil
		}, "Filter/Outcome", 0},
		{"rejects with an error that is no status", func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			return nil, errors.New("denied")
		}, "Filter/Outcome", 0},
		{"turns next's success into an error that is no status", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if _, err := next(ctx, info, req); err != nil {
				return nil, err
			}
			return nil, errors.New("response looked wrong")
		}, "Filter/Response", 0},
		{"replaces the request metadata", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			info.Metadata = kernel.Metadata{"trace-id": "1"}
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", 0},
		{"overwrites a metadata entry", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			for k := range info.Metadata {
				if strings.HasPrefix(k, "plugintest-") && k != filterMDKey {
					info.Metadata[k] = strings.ToLower(info.Metadata[k]) + "!"
				}
			}
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", 0},
		{"renames the method", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			info.Method = strings.ToLower(info.Method)
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", 0},
		{"calls next with a copy of CallInfo", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			own := &kernel.CallInfo{Method: info.Method, Side: info.Side, Peer: info.Peer, Codec: info.Codec, Metadata: info.Metadata.Clone()}
			return next(ctx, own, req) // own.ResponseMetadata is never copied back
		}, "Filter/ResponseMetadata", 0},
		{"swallows errors", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, _ := next(ctx, info, req)
			return resp, nil
		}, "Filter/Error", 0},
		{"flattens errors to Unknown", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			if err != nil {
				return nil, errors.New(err.Error())
			}
			return resp, nil
		}, "Filter/Error", 0},
		{"detaches the context", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			return next(context.WithoutCancel(ctx), info, req)
		}, "Filter/CancelledContext/Before", kernel.ClientSide},
		{"detaches the context while next runs", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			if err := ctx.Err(); err != nil {
				return nil, kernel.StatusOf(err)
			}
			return next(context.WithoutCancel(ctx), info, req)
		}, "Filter/CancelledContext/During", kernel.ServerSide},
		{"swallows a cancellation next reported", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			if err != nil && ctx.Err() != nil {
				return &filterResp{id: "fallback"}, nil
			}
			return resp, err
		}, "Filter/CancelledContext/Before", 0},
		{"keeps the call in the filter", filterSharedState(), "Filter/Concurrent", 0},
	}
	// All at once, as registryCatches does: two of them wait out
	// filterCancelGrace, and the rest need not wait for those.
	recs := make([]*recording, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Go(func() { recs[i] = filterRecord(t, filterFuncFactory(tc.filter), FilterConfig{Side: tc.side}) })
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { expectCaught(t, recs[i], tc.path) })
	}
}

// filterSharedState keeps the call it is handling in the filter value, as a
// filter written for one call at a time might: concurrent calls then pass
// each other's CallInfo on. A mutex keeps it free of data races, so that
// the suite, not the race detector, must catch it.
func filterSharedState() kernel.FilterFunc {
	var mu sync.Mutex
	var cur *kernel.CallInfo
	return func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
		mu.Lock()
		cur = info
		mu.Unlock()
		runtime.Gosched()
		mu.Lock()
		info = cur
		mu.Unlock()
		return next(ctx, info, req)
	}
}

func TestFilterCatchesBadOptions(t *testing.T) {
	cases := []struct {
		name  string
		build func(*filterStampOptions) (kernel.Filter, error)
	}{
		{"accepted", func(o *filterStampOptions) (kernel.Filter, error) { return &filterStamp{key: o.Key}, nil }},
		{"refused without naming the key", func(o *filterStampOptions) (kernel.Filter, error) {
			if o.Limit < 0 {
				return nil, errors.New("invalid configuration")
			}
			return &filterStamp{key: o.Key}, nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := kernel.NewFactory("stamp", "", func() *filterStampOptions { return &filterStampOptions{Key: "stamp"} }, tc.build)
			rec := filterRecord(t, f, filterStampConfig)
			expectCaught(t, rec, "Filter/BadOptions")
		})
	}
	t.Run("no key named", func(t *testing.T) {
		cfg := filterStampConfig
		cfg.BadOptionsKey = ""
		expectCaught(t, filterRecord(t, filterStampFactory, cfg), "Filter/BadOptions")
	})
	t.Run("none given", func(t *testing.T) {
		rec := filterRecord(t, filterStampFactory, FilterConfig{})
		if why := rec.skippedUnder("Filter/BadOptions"); !strings.Contains(why, "BadOptions") {
			t.Errorf("Filter/BadOptions without BadOptions: skip reason %q, want one naming FilterConfig.BadOptions", why)
		}
	})
}

func TestFilterPanicIsAFailureNotACrash(t *testing.T) {
	rec := filterRecord(t, filterFuncFactory(func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
		panic("filter bug")
	}), FilterConfig{})
	expectCaught(t, rec, "Filter/Outcome/Client")
	expectCaught(t, rec, "Filter/Outcome/Server")
}

// A filter broken on one side only passes when configured for the other:
// FilterConfig.Side limits the checks to the side the filter runs on. A
// second call of next is a retry on the client, but runs the handler twice
// on the server.
func TestFilterChecksOnlyTheConfiguredSide(t *testing.T) {
	serverBug := filterFuncFactory(func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
		next(ctx, info, req) // a naive retry, on both sides
		return next(ctx, info, req)
	})
	codecExpectClean(t, filterRecord(t, serverBug, FilterConfig{Side: kernel.ClientSide}))
	rec := filterRecord(t, serverBug, FilterConfig{})
	expectCaught(t, rec, "Filter/Attempts/Server")
	if rec.failedUnder("Filter/Attempts/Client") {
		t.Error("the client side was failed for a bug only the server side has")
	}
}
