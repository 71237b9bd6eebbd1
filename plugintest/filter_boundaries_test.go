package plugintest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/kernrpc/kernrpc/kernel"
)

// TestFilterCatchesBoundaryDefects: filters with one defect each that
// shows only on long or unusual calls, or over several calls, caught by
// the subtest of the property it breaks.
func TestFilterCatchesBoundaryDefects(t *testing.T) {
	cases := []struct {
		name   string
		filter kernel.FilterFunc
		path   string
		says   string // words the complaint there must hold, if set
	}{
		{"cuts metadata values at 4 KiB", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			for k, v := range info.Metadata {
				if len(v) > 4<<10 {
					info.Metadata[k] = v[:4<<10] // "bound the headers"
				}
			}
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", ""},
		{"lower-cases metadata keys", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			md := make(kernel.Metadata, len(info.Metadata))
			for k, v := range info.Metadata {
				md[strings.ToLower(k)] = v // as HTTP/2 headers are
			}
			info.Metadata = md
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", ""},
		{"takes the service from the method's first dot", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			service := info.Method[:strings.IndexByte(info.Method, '.')] // panics without a dot
			info.SetRequestMetadata("x-service", service)
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", ""},
		{"copies back only printable response metadata", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			own := *info
			own.ResponseMetadata = nil
			resp, err := next(ctx, &own, req)
			for k, v := range own.ResponseMetadata {
				if strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
					info.SetResponseMetadata(k, v)
				}
			}
			return resp, err
		}, "Filter/ResponseMetadata", ""},
		{"rebuilds statuses with their message cut to 256 bytes", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			var st *kernel.Status
			if errors.As(err, &st) && len(st.Message) > 256 {
				return nil, &kernel.Status{Code: st.Code, Message: st.Message[:256], Retryable: st.Retryable}
			}
			return resp, err
		}, "Filter/Error", ""},
		{"caches responses by the method's first 32 bytes", filterPrefixCache(32), "Filter/Methods", ""},
		{"refuses metadata values with control characters", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			for _, v := range info.Metadata {
				if strings.ContainsAny(v, "\x00\r\n") { // "header injection"
					return nil, kernel.Errorf(kernel.InvalidArgument, "metadata value with a control character")
				}
			}
			return next(ctx, info, req)
		}, "Filter/RequestMetadata", "which it let through with plain values"},
		{"joins a status of its own ahead of next's error", func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
			resp, err := next(ctx, info, req)
			if err != nil {
				// errors.Is still finds next's error; the code the
				// caller reads is the first status's.
				return nil, errors.Join(kernel.Errorf(kernel.Unavailable, "upstream call failed"), err)
			}
			return resp, nil
		}, "Filter/Error", "next failed with code NotFound but the caller got code Unavailable"},
	}
	recs := make([]*recording, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Go(func() { recs[i] = filterRecord(t, filterFuncFactory(tc.filter), FilterConfig{}) })
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCaught(t, recs[i], tc.path)
			if tc.says != "" {
				expectMessage(t, recs[i], tc.path, tc.says)
			}
		})
	}
}

// filterPrefixCache answers a method it has answered before from a cache
// keyed by the method's first n bytes, a fixed-size key: methods that
// share those bytes get each other's responses.
func filterPrefixCache(n int) kernel.FilterFunc {
	var mu sync.Mutex
	cache := make(map[string]any)
	return func(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
		key := info.Method
		if len(key) > n {
			key = key[:n]
		}
		mu.Lock()
		resp, hit := cache[key]
		mu.Unlock()
		if hit {
			return resp, nil
		}
		resp, err := next(ctx, info, req)
		if err == nil {
			mu.Lock()
			cache[key] = resp
			mu.Unlock()
		}
		return resp, err
	}
}

// A cache keyed by the whole method passes Methods: answering a method
// with its own earlier response is what a cache does.
func TestFilterPassesACacheKeyedByTheWholeMethod(t *testing.T) {
	rec := filterRecord(t, filterFuncFactory(filterPrefixCache(1<<30)), FilterConfig{})
	codecExpectClean(t, rec)
}

// An option error names the key as the kernel does, or it does not name
// it: "limit" the word is in messages about any option.
func TestFilterBadOptionsNeedTheKernelsShape(t *testing.T) {
	refuse := func(msg string) func(*filterStampOptions) (kernel.Filter, error) {
		return func(o *filterStampOptions) (kernel.Filter, error) {
			if o.Limit < 0 {
				return nil, errors.New(msg)
			}
			return &filterStamp{key: o.Key}, nil
		}
	}
	badOptions := func(f kernel.Factory[kernel.Filter], cfg FilterConfig) *recording {
		return record(t, "Filter", func(t tb) { t.Run("BadOptions", func(t tb) { filterBadOptions(t, f, cfg) }) })
	}
	for _, tc := range []struct {
		msg    string
		caught bool
	}{
		{"the limit must not be negative", true},
		{`option "limits": must not be negative`, true},
		{`limit: must not be negative`, true},
		{`option "limit": must not be negative`, false},
	} {
		f := kernel.NewFactory("stamp", "", func() *filterStampOptions { return &filterStampOptions{Key: "stamp"} }, refuse(tc.msg))
		rec := badOptions(f, filterStampConfig)
		if got := rec.failedUnder("Filter/BadOptions"); got != tc.caught {
			t.Errorf("error %q: Filter/BadOptions failed = %v, want %v", tc.msg, got, tc.caught)
		}
	}
	// The kernel's own errors name the key through kernel.OptionKey.
	cfg := filterStampConfig
	cfg.BadOptions, cfg.BadOptionsKey = map[string]any{"limit": "many"}, "limit"
	if rec := badOptions(filterStampFactory, cfg); rec.failedUnder("Filter/BadOptions") {
		t.Errorf("a wrong type, refused by the kernel's decoder, failed Filter/BadOptions: %v", rec.failures)
	}
}
