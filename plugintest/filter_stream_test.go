package plugintest

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// streamFilterFunc is a stream filter's InvokeStream as a function.
type streamFilterFunc func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error

// streamFuncFilter passes unary calls on untouched and streams through
// its function, so that only the stream checks can fail it.
type streamFuncFilter struct{ stream streamFilterFunc }

var _ kernel.StreamFilter = streamFuncFilter{}

func (f streamFuncFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f streamFuncFilter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	return f.stream(ctx, info, st, next)
}

func streamFuncFactory(f streamFilterFunc) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{
		Name: "broken-stream",
		New:  func(any) (kernel.Filter, error) { return streamFuncFilter{f}, nil },
	}
}

// streamRecord runs the Stream part of the Filter suite alone.
func streamRecord(t *testing.T, f kernel.Factory[kernel.Filter], cfg FilterConfig) *recording {
	t.Helper()
	return record(t, "Filter", func(t tb) { t.Run("Stream", func(t tb) { filterStreamSuite(t, f, cfg) }) })
}

// countingStream counts the messages that pass, as a metrics filter's
// wrapper does: atomically, since one goroutine may send while another
// receives.
type countingStream struct {
	kernel.Stream
	sent, received *atomic.Int64
}

func (s countingStream) SendMsg(m any) error {
	err := s.Stream.SendMsg(m)
	if err == nil {
		s.sent.Add(1)
	}
	return err
}

func (s countingStream) RecvMsg(m any) error {
	err := s.Stream.RecvMsg(m)
	if err == nil {
		s.received.Add(1)
	}
	return err
}

// streamStamp is filterStamp with a stream form: it stamps the request
// metadata, counts the messages, and returns next's outcome.
type streamStamp struct {
	filterStamp
	streams, messages atomic.Int64
}

func (f *streamStamp) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if err := ctx.Err(); err != nil {
		return kernel.StatusOf(err)
	}
	info.SetRequestMetadata(f.key, "stamped")
	var sent, received atomic.Int64
	err := next(ctx, info, countingStream{st, &sent, &received})
	f.streams.Add(1)
	f.messages.Add(sent.Load() + received.Load())
	return err
}

func TestFilterStreamPassesGoodStreamFilters(t *testing.T) {
	t.Run("stamp and count, the whole suite", func(t *testing.T) {
		var built []*streamStamp
		var mu sync.Mutex
		f := kernel.NewFactory("stamp", "", func() *filterStampOptions { return &filterStampOptions{Key: "stamp"} },
			func(o *filterStampOptions) (kernel.Filter, error) {
				if o.Limit < 0 {
					return nil, errors.New(`option "limit" must not be negative`)
				}
				s := &streamStamp{filterStamp: filterStamp{key: o.Key}}
				mu.Lock()
				built = append(built, s)
				mu.Unlock()
				return s, nil
			})
		rec := filterRecord(t, f, filterStampConfig)
		codecExpectClean(t, rec)
		for _, path := range []string{"Filter/Stream/Messages", "Filter/Stream/Metadata", "Filter/Stream/FinalStatus",
			"Filter/Stream/Refused", "Filter/Stream/CancelledContext/During", "Filter/Stream/Concurrent", "Filter/Stream/Leaks"} {
			if why := rec.skippedUnder(path); why != "" {
				t.Errorf("%s skipped for a stream filter that passes streams: %s", path, why)
			}
		}
		var streams, messages int64
		for _, s := range built {
			streams += s.streams.Load()
			messages += s.messages.Load()
		}
		if streams == 0 || messages == 0 {
			t.Errorf("the suite ran %d streams and %d messages through the filter; the stream checks did not run", streams, messages)
		}
	})
	t.Run("pass-through", func(t *testing.T) {
		codecExpectClean(t, streamRecord(t, streamFuncFactory(func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(ctx, info, st)
		}), FilterConfig{}))
	})
	t.Run("requires metadata, given it", func(t *testing.T) {
		rec := streamRecord(t, streamFuncFactory(streamNeedsToken), FilterConfig{Metadata: kernel.Metadata{"token": "secret"}})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Stream/Messages"); why != "" {
			t.Errorf("FilterConfig.Metadata did not let the suite's streams through: %s", why)
		}
	})
	t.Run("refuses everything, declared", func(t *testing.T) {
		rec := streamRecord(t, streamFuncFactory(func(context.Context, *kernel.CallInfo, kernel.Stream, kernel.StreamInvoker) error {
			return kernel.Errorf(kernel.PermissionDenied, "nobody may stream")
		}), FilterConfig{RejectsEveryCall: true})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Stream/Messages/Client"); !strings.Contains(why, "RejectsEveryCall") {
			t.Errorf("Stream/Messages on a filter declared to refuse everything: skip reason %q, want one naming FilterConfig.RejectsEveryCall", why)
		}
		if why := rec.skippedUnder("Filter/Stream/Refused"); why != "" {
			t.Errorf("Stream/Refused skipped for a filter that declares it refuses everything: %s", why)
		}
	})
	t.Run("replaces next's status with its own", func(t *testing.T) {
		codecExpectClean(t, streamRecord(t, streamFuncFactory(func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if err := next(ctx, info, st); err != nil {
				return kernel.Errorf(kernel.CodeOf(err), "the stream failed") // hides the handler's message
			}
			return nil
		}), FilterConfig{}))
	})
	t.Run("watches the context on a goroutine it stops", func(t *testing.T) {
		codecExpectClean(t, streamRecord(t, streamFuncFactory(func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				select {
				case <-ctx.Done():
				case <-stop:
				}
			})
			defer wg.Wait()
			defer close(stop)
			return next(ctx, info, st)
		}), FilterConfig{}))
	})
	t.Run("unary only", func(t *testing.T) {
		rec := streamRecord(t, filterStampFactory, filterStampConfig)
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Stream"); !strings.Contains(why, "kernel.StreamFilter") {
			t.Errorf("Filter/Stream on a filter without a stream form: skip reason %q, want one naming kernel.StreamFilter", why)
		}
	})
}

// streamNeedsToken refuses streams without the token before next.
func streamNeedsToken(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if info.Side == kernel.ServerSide && info.Metadata["token"] != "secret" {
		return kernel.Errorf(kernel.Unauthenticated, "no token")
	}
	return next(ctx, info, st)
}

// dropFirstRecv loses the first message it receives, as a filter that
// peeks at it to decide and forgets to hand it on does.
type dropFirstRecv struct {
	kernel.Stream
	once sync.Once
}

func (s *dropFirstRecv) RecvMsg(m any) error {
	var err error
	s.once.Do(func() { err = s.Stream.RecvMsg(m) })
	if err != nil {
		return err
	}
	return s.Stream.RecvMsg(m)
}

// slowFirstRecv says when the first RecvMsg starts, then takes its time.
type slowFirstRecv struct {
	kernel.Stream
	started chan struct{}
	once    sync.Once
}

func (s *slowFirstRecv) RecvMsg(m any) error {
	s.once.Do(func() {
		close(s.started)
		time.Sleep(10 * time.Millisecond)
	})
	return s.Stream.RecvMsg(m)
}

// sendTwice sends every message twice, as a retrying write would.
type sendTwice struct{ kernel.Stream }

func (s sendTwice) SendMsg(m any) error {
	if err := s.Stream.SendMsg(m); err != nil {
		return err
	}
	return s.Stream.SendMsg(m)
}

// recvOwn decodes into a message of its own and hands the caller nothing.
type recvOwn struct{ kernel.Stream }

func (s recvOwn) RecvMsg(m any) error {
	var own streamMsg
	return s.Stream.RecvMsg(&own)
}

// streamShared keeps the stream it is handling in the filter value, as a
// filter written for one stream at a time might; a mutex keeps it free of
// data races, so that the suite, not the race detector, must catch it.
func streamShared() streamFilterFunc {
	var mu sync.Mutex
	var cur kernel.Stream
	return func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
		mu.Lock()
		cur = st
		mu.Unlock()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		mu.Lock()
		st = cur
		mu.Unlock()
		return next(ctx, info, st)
	}
}

func TestFilterStreamCatchesBrokenStreamFilters(t *testing.T) {
	release := make(chan struct{}) // ends the goroutines the leaking filter leaves
	defer close(release)
	cases := []struct {
		name   string
		filter streamFilterFunc
		cfg    FilterConfig
		path   string
		msg    string // in the failure's message
	}{
		{"drops the first message received", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(ctx, info, &dropFirstRecv{Stream: st})
		}, FilterConfig{}, "Filter/Stream/Messages", "in order"},
		{"sends every message twice", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(ctx, info, sendTwice{st})
		}, FilterConfig{}, "Filter/Stream/Messages", "in order"},
		{"receives into a message of its own", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(ctx, info, recvOwn{st})
		}, FilterConfig{}, "Filter/Stream/Messages", "left the caller's message empty"},
		{"returns once the stream is under way", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			underWay := &slowFirstRecv{Stream: st, started: make(chan struct{})}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				_ = next(ctx, info, underWay) // the defect: nobody waits for it
			}()
			select {
			case <-underWay.started:
			case <-ended:
			}
			return nil
		}, FilterConfig{}, "Filter/Stream/Messages", "next was still running"},
		{"sends a last message from a goroutine after returning", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			err := next(ctx, info, st)
			go func() {
				time.Sleep(filterLateWindow / 5)
				_ = st.SendMsg(&streamMsg{stream: "stream", seq: -1}) // a summary, flushed in the background
			}()
			return err
		}, FilterConfig{}, "Filter/Stream/AfterReturn", "called SendMsg on the stream after InvokeStream returned"},
		{"drains the stream from a goroutine after returning", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			err := next(ctx, info, st)
			go func() {
				time.Sleep(filterLateWindow / 5)
				_ = st.RecvMsg(new(streamMsg)) // what the handler left unread
			}()
			return err
		}, FilterConfig{}, "Filter/Stream/AfterReturn", "called RecvMsg on the stream after InvokeStream returned"},
		{"returns nil without calling next", func(context.Context, *kernel.CallInfo, kernel.Stream, kernel.StreamInvoker) error {
			return nil
		}, FilterConfig{}, "Filter/Stream/Messages", "without calling next"},
		{"replaces the request metadata", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			info.Metadata = kernel.Metadata{"trace-id": "1"}
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/Metadata", "request metadata"},
		{"passes a copy of CallInfo and drops the trailers", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			own := &kernel.CallInfo{Method: info.Method, Side: info.Side, Peer: info.Peer, Codec: info.Codec, Metadata: info.Metadata.Clone()}
			return next(ctx, own, st)
		}, FilterConfig{Side: kernel.ClientSide}, "Filter/Stream/Metadata/Client", "trailer"},
		{"swallows the final status", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			_ = next(ctx, info, st)
			return nil
		}, FilterConfig{}, "Filter/Stream/FinalStatus", "returned nil"},
		{"flattens the final status to a plain error", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if err := next(ctx, info, st); err != nil {
				return errors.New(err.Error())
			}
			return nil
		}, FilterConfig{}, "Filter/Stream/FinalStatus", "neither is that error"},
		{"retries a stream that failed as retryable", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			err := next(ctx, info, st)
			if kernel.IsRetryable(err) {
				err = next(ctx, info, st)
			}
			return err
		}, FilterConfig{}, "Filter/Stream/NextOnce", "at most once"},
		{"refuses after next ran", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			err := next(ctx, info, st)
			if info.Metadata["token"] != "secret" {
				return kernel.Errorf(kernel.Unauthenticated, "no token")
			}
			return err
		}, FilterConfig{Metadata: kernel.Metadata{"token": "secret"}}, "Filter/Stream/Refused", "refuse a stream before calling next"},
		{"refuses with an error that is no status", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if info.Metadata == nil {
				return errors.New("no metadata")
			}
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/Refused", "not a *kernel.Status"},
		{"panics on nil metadata", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			info.Metadata["trace-id"] = "1"
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/Refused", "SetRequestMetadata"},
		{"claims to refuse everything but passes streams", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(ctx, info, st)
		}, FilterConfig{RejectsEveryCall: true}, "Filter/Stream/Refused", "RejectsEveryCall"},
		{"detaches the context", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			return next(context.WithoutCancel(ctx), info, st)
		}, FilterConfig{Side: kernel.ServerSide}, "Filter/Stream/CancelledContext", "live context"},
		{"detaches the context while the stream runs", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if err := ctx.Err(); err != nil {
				return kernel.StatusOf(err)
			}
			return next(context.WithoutCancel(ctx), info, st)
		}, FilterConfig{Side: kernel.ClientSide}, "Filter/Stream/CancelledContext/During", "was not cancelled"},
		{"keeps the stream in the filter", streamShared(), FilterConfig{}, "Filter/Stream/Concurrent", "another stream"},
		{"fails a stream that ended OK with a plain error", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if err := next(ctx, info, st); err != nil {
				return err
			}
			return errors.New("stream accounting: quota store unreachable")
		}, FilterConfig{}, "Filter/Stream/Messages", "not a *kernel.Status; a filter that fails a stream"},
		{"lowercases the method for next", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			info.Method = strings.ToLower(info.Method) // a metrics key, written back
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/Metadata", "next saw method"},
		{"puts a code of its own before next's status", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if err := next(ctx, info, st); err != nil {
				return errors.Join(kernel.Errorf(kernel.Internal, "stream failed"), err)
			}
			return nil
		}, FilterConfig{}, "Filter/Stream/FinalStatus", "but the filter's error says code Internal"},
		{"refuses streams without metadata", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if len(info.Metadata) == 0 {
				return kernel.Errorf(kernel.Unauthenticated, "no credentials")
			}
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/Refused", "refused a stream that carries no metadata"},
		{"asserts the stream's concrete type", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			_ = st.(interface{ Peer() string }) // the engine's stream has one; the suite's does not
			return next(ctx, info, st)
		}, FilterConfig{}, "Filter/Stream/CancelledContext/Before", "InvokeStream with a cancelled context panicked"},
		{"needs a token its FilterConfig does not give", streamNeedsToken, FilterConfig{},
			"Filter/Stream/Messages", "refused a stream its FilterConfig should let through"},
		{"refuses every stream of a burst", streamBurstShedder(), FilterConfig{},
			"Filter/Stream/Concurrent", "refused all 8 streams opened at once"},
		{"leaves a goroutine behind per stream", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			go func() { <-release }() // a flusher nobody stops
			return next(ctx, info, st)
		}, FilterConfig{Side: kernel.ServerSide}, "Filter/Stream/Leaks", "still run"},
		{"hangs, ignoring its context", func(context.Context, *kernel.CallInfo, kernel.Stream, kernel.StreamInvoker) error {
			<-release
			return kernel.Errorf(kernel.Unavailable, "released")
		}, FilterConfig{Side: kernel.ClientSide, Patience: 100 * time.Millisecond}, "Filter/Stream/Messages", "InvokeStream on the client side did not return within 100ms"},
		{"hangs on a stream without metadata", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if info.Metadata == nil {
				<-release
			}
			return next(ctx, info, st)
		}, FilterConfig{Side: kernel.ServerSide, Patience: 100 * time.Millisecond}, "Filter/Stream/Refused", "InvokeStream on the server side did not return within 100ms"},
		{"hangs on a cancelled stream", func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
			if ctx.Err() != nil {
				<-release
			}
			return next(ctx, info, st)
		}, FilterConfig{Side: kernel.ServerSide, Patience: 100 * time.Millisecond}, "Filter/Stream/CancelledContext/Before", "InvokeStream with a cancelled context did not return within 100ms"},
	}
	recs := make([]*recording, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Go(func() { recs[i] = streamRecord(t, streamFuncFactory(tc.filter), tc.cfg) })
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCaught(t, recs[i], tc.path)
			expectMessage(t, recs[i], tc.path, tc.msg)
		})
	}
}

// streamBurstShedder sheds bursts: it holds each stream until the end of
// a 50ms window, opened by the first stream to arrive outside one, and
// refuses every stream of a window in which 4 or more waited at once.
// Counting those waiting at once, not those that arrived, keeps the
// suite's checks that open streams one after another (some cancelled at
// once) from looking like a burst when a slow machine packs them into
// one window: only Concurrent's 8 streams opened together do.
func streamBurstShedder() streamFilterFunc {
	type window struct {
		ends          time.Time
		waiting, peak int
	}
	var mu sync.Mutex
	var cur *window
	return func(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
		mu.Lock()
		if now := time.Now(); cur == nil || !now.Before(cur.ends) {
			cur = &window{ends: now.Add(50 * time.Millisecond)}
		}
		w := cur
		w.waiting++
		w.peak = max(w.peak, w.waiting)
		mu.Unlock()
		var err error
		select {
		case <-time.After(time.Until(w.ends)):
		case <-ctx.Done():
			err = kernel.StatusOf(ctx.Err())
		}
		mu.Lock()
		w.waiting--
		burst := w.peak
		mu.Unlock()
		switch {
		case err != nil:
			return err
		case burst >= 4:
			return kernel.Errorf(kernel.ResourceExhausted, "a burst of %d streams", burst)
		}
		return next(ctx, info, st)
	}
}
