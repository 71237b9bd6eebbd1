// Package accesslog is a filter that logs one structured line per call
// through log/slog: side, method, peer, code, duration, and the request's
// and response's sizes when they are known. Successful calls are sampled;
// failed ones are always logged.
//
// Config name: "log" (the package is named accesslog, so as not to shadow
// the standard library's log). Options, with defaults:
//
//	filters:
//	  - name: log
//	    options:
//	      sample: 1           # the share of successful calls logged, 0 to 1 (0.01: one in a hundred)
//	      slow: 0s            # a call at least this long is always logged; 0: off
//	      level: INFO         # the level of a successful call's line
//	      error_level: WARN   # the level of a failed call's line
//
// A line reads (slog's text handler):
//
//	level=INFO msg=call side=server method=Echo.Who peer=127.0.0.1:50432 code=OK duration=182µs req_bytes=16 resp_bytes=21
//	level=WARN msg=call side=client method=Echo.Who peer=127.0.0.1:7000 attempt=2 code=Unavailable duration=1.2ms req_bytes=16 err="dependency down"
//
// # What a filter can know
//
// The peer is, on the server, the client's address; on the client, the
// instance the (last) attempt went to, and attempt numbers the attempts.
// On the client the filter runs in the call stage, one line per call; with
// stage: attempt, one line per attempt. Sizes are those the messages
// report of themselves, req_bytes and resp_bytes: a message with
// vtprotobuf's SizeVT() or a Size() method, or a []byte; for any other
// message the key is left out. The bytes on the wire (framing, another
// codec's encoding) are not visible at the filter level: the client
// encodes after its filters ran, the server decoded before. The duration
// is the time spent in the rest of the chain. A call or stream whose rest
// of the chain panics (a handler: the engine answers it Internal) is a
// failure, logged with code=Internal as the panic goes on up; for a
// call, a recover filter after this one puts the panic's value in err.
// An error that claims OK (a *kernel.Status with code OK) is logged
// code=Unknown, as the engine sends it: an error is no answer. A
// server's line of a handled call is written when the rest of the chain
// returns, with its outcome: an answer that then fails to encode (sent
// as Internal) or that the transport refuses for its size (sent as
// ResourceExhausted) is logged as the chain ended it.
//
// On the server, a call answered before the filters ran (an Admitter
// refused it: auth, token-bucket, overload; or its request did not
// decode) is a failure too, logged through kernel.CallObserver at
// error_level, without duration and sizes, wherever the filter stands in
// the config:
//
//	level=WARN msg=call side=server method=Echo.Who peer=127.0.0.1:50432 code=ResourceExhausted err="token-bucket: Echo.Who is over its rate limit (...); retry after 8ms"
//
// A call that is not sampled costs two clock reads and a random draw, and
// no allocation; the lines go to Options.Logger (slog.Default()).
//
// # Streams
//
// The filter is a kernel.StreamFilter: a streaming call gets one line
// when it ends, msg=stream, by the same options (failures always, at
// error_level; successes when slow or sampled, at level), with the
// messages each side sent and received through it and, when every
// message one way reports its size (as above), their bytes:
//
//	level=INFO msg=stream side=server method=Chat.Talk peer=127.0.0.1:50432 code=OK duration=2.1s sent_msgs=120 recv_msgs=118 sent_bytes=5230 recv_bytes=4987
//	level=WARN msg=stream side=client method=Chat.Talk peer=127.0.0.1:7000 attempt=1 code=Canceled duration=340ms sent_msgs=3 recv_msgs=2 err="..."
//
// The duration is the stream's life as its side sees it: on the server
// the handler's run, on the client from the opening until the caller has
// read the end (or closed the stream). The sizes are added up only when
// the logger is enabled at level or error_level, and a stream costs one
// allocation (its counters) and an atomic add per message.
package accesslog

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "log"

// Options configure the filter.
type Options struct {
	// Sample is the share of successful calls logged, from 0 to 1.
	Sample float64 `json:"sample"`
	// Slow logs every call that takes at least this long; 0 turns it off.
	Slow kernel.Duration `json:"slow"`
	// Level is the level of a successful call's line: DEBUG, INFO, WARN or
	// ERROR.
	Level string `json:"level"`
	// ErrorLevel is the level of a failed call's line.
	ErrorLevel string `json:"error_level"`
	// Logger receives the lines; nil means slog.Default() at the time of
	// each line. Code only: config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Sample: 1, Level: "INFO", ErrorLevel: "WARN"}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "logs one structured line per call, sampled; failures always", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	if !(o.Sample >= 0 && o.Sample <= 1) {
		return nil, fmt.Errorf("option \"sample\": must be between 0 and 1, got %v", o.Sample)
	}
	if o.Slow < 0 {
		return nil, fmt.Errorf("option \"slow\": must not be negative, got %s", o.Slow)
	}
	f := &Filter{sample: o.Sample, slow: o.Slow.D(), log: o.Logger, rand: rand.Float64}
	var err error
	if f.level, err = parseLevel(o.Level); err != nil {
		return nil, fmt.Errorf("option \"level\": %w", err)
	}
	if f.errorLevel, err = parseLevel(o.ErrorLevel); err != nil {
		return nil, fmt.Errorf("option \"error_level\": %w", err)
	}
	return f, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not a level; use DEBUG, INFO, WARN or ERROR", s)
	}
	return l, nil
}

// Filter is the log filter.
type Filter struct {
	sample            float64
	slow              time.Duration
	level, errorLevel slog.Level
	log               *slog.Logger
	// rand draws in [0, 1): tests replace it before the first call.
	rand func() float64
}

var _ kernel.Filter = (*Filter)(nil)

// Invoke passes the call on and logs it, if it failed, was slow or is
// sampled.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	start := time.Now()
	// A next that panics (a handler: the engine turns its panic into
	// Internal above the chain) is a failed call, which is always logged;
	// the panic goes on up. An open-coded defer: about a ns.
	returned := false
	defer func() {
		if !returned {
			f.line(ctx, f.errorLevel, info, req, nil, panicked(info), time.Since(start))
		}
	}()
	resp, err := next(ctx, info, req)
	returned = true
	took := time.Since(start)
	level := f.errorLevel
	if err == nil {
		if (f.slow == 0 || took < f.slow) && (f.sample == 0 || (f.sample < 1 && f.rand() >= f.sample)) {
			return resp, err
		}
		level = f.level
	}
	f.line(ctx, level, info, req, resp, err, took)
	return resp, err
}

// line logs one call.
func (f *Filter) line(ctx context.Context, level slog.Level, info *kernel.CallInfo, req, resp any, err error, took time.Duration) {
	log := f.logger()
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("side", info.Side.String()), slog.String("method", info.Method), slog.String("peer", info.Peer))
	if info.Side == kernel.ClientSide && info.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", info.Attempt))
	}
	attrs = append(attrs, slog.String("code", kernel.CodeOf(err).String()), slog.Duration("duration", took))
	if n, ok := size(req); ok {
		attrs = append(attrs, slog.Int("req_bytes", n))
	}
	if err == nil {
		if n, ok := size(resp); ok {
			attrs = append(attrs, slog.Int("resp_bytes", n))
		}
	} else {
		attrs = append(attrs, errAttr(err))
	}
	log.LogAttrs(ctx, level, "call", attrs...)
}

// logger is where the lines go: Options.Logger, else slog.Default() as it
// is now.
func (f *Filter) logger() *slog.Logger {
	if f.log != nil {
		return f.log
	}
	return slog.Default()
}

// errAttr is a failed call's err field: its status message.
func errAttr(err error) slog.Attr {
	return slog.String("err", strings.TrimPrefix(kernel.StatusOf(err).Message, "kernrpc: "))
}

var _ kernel.CallObserver = (*Filter)(nil)

// CallEnded logs, on the server, a call answered before any filter's
// Invoke ran (handled false): one an Admitter refused (auth, token-bucket,
// overload), or whose request did not decode. It failed, so it is logged
// at error_level, with what is known of it: no duration (nothing ran) and
// no message sizes (nothing was decoded). The calls that went through
// Invoke were logged there.
func (f *Filter) CallEnded(info *kernel.CallInfo, err error, handled bool) {
	if handled || err == nil {
		return
	}
	log, ctx := f.logger(), context.Background()
	if !log.Enabled(ctx, f.errorLevel) {
		return
	}
	log.LogAttrs(ctx, f.errorLevel, "call", slog.String("side", info.Side.String()), slog.String("method", info.Method),
		slog.String("peer", info.Peer), slog.String("code", kernel.CodeOf(err).String()), errAttr(err))
}

// panicked is the error a line gives a call or stream whose next
// panicked: the engine answers it Internal.
func panicked(info *kernel.CallInfo) error {
	return kernel.Errorf(kernel.Internal, "%s panicked", info.Method)
}

// size is the encoded size a message reports of itself, if it does.
func size(m any) (int, bool) {
	switch v := m.(type) {
	case interface{ SizeVT() int }:
		return v.SizeVT(), true
	case interface{ Size() int }:
		return v.Size(), true
	case []byte:
		return len(v), true
	}
	return 0, false
}
