// Package recovery is a filter that turns a panic in the rest of the
// chain (the filters after it, and the handler or the client's send)
// into a call that fails with Internal, logging the panic and its stack:
// one bad call costs that call, not the process.
//
// Config name: "recover" (the package is named recovery, since recover is
// Go's builtin). Options, with defaults:
//
//	filters:
//	  - name: recover
//	    options:
//	      stack: true   # log the panicking goroutine's stack with the panic
//
// # On by default?
//
// The server already recovers a panic of its handlers and filters, in the
// engine (serverConn.invoke): that stays the last line of defence, always
// on, so a server without this filter stays up too. The filter is
// therefore not added to every chain; configure it where it adds
// something:
//
//   - On the client, where nothing else recovers: a panicking client
//     filter, codec or balancer would otherwise take the caller's program
//     down. There the panic becomes the call's error.
//   - Anywhere in a chain, early (after the filters that observe calls:
//     a log, metrics, a breaker), so that those see the panic as an
//     Internal failure they count and log, instead of being unwound past
//     by it.
//
// The error reads "recover: Echo.Who panicked on the server side: <the
// panic's value>"; the log line (level Error, through slog.Default())
// has the side, method, peer, panic and, with stack, the stack. Only a
// panic on the goroutine that runs the chain is caught: one on a goroutine
// a later filter starts (a hedge's attempt) is that filter's to recover.
// A client call that panicked inside the engine gives up that call's
// pooled state, which is no leak: the garbage collector takes it. A panic
// in an attempt filter still ends its pick for the balancer, so that one
// counting the calls in flight on each instance (least-load) does not
// count it there for ever.
//
// # Streams
//
// The filter is a kernel.StreamFilter: a panic in the rest of a stream's
// chain (the stream filters after it, the handler) ends the stream with
// the same Internal status and log line. On the client that is where it
// matters most: a stream's filters run on a goroutine of their own, so a
// panicking client stream filter would otherwise end the program; the
// stream then fails to open with that status. A panic in a handler's own
// goroutines, or in the caller's SendMsg and RecvMsg (which run on the
// caller's goroutine, not the chain's), is not caught.
package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "recover"

// Options configure the filter.
type Options struct {
	// Stack logs the stack of the goroutine that panicked.
	Stack bool `json:"stack"`
	// Logger receives the panics; nil means slog.Default(). Code only:
	// config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options { return &Options{Stack: true} }

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "turns a panic in the rest of the chain into an Internal error, logged with its stack", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter.
func New(o *Options) (kernel.Filter, error) {
	return &Filter{stack: o.Stack, log: o.Logger}, nil
}

// Filter is the recover filter.
type Filter struct {
	stack bool
	log   *slog.Logger // nil: slog.Default() at the time of the panic
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.StreamFilter = (*Filter)(nil)
)

// Invoke passes the call on, recovering a panic into Internal.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, f.recovered(ctx, info, p)
		}
	}()
	return next(ctx, info, req)
}

// InvokeStream passes the stream on, recovering a panic into Internal: on
// the client a stream's filters run on a goroutine of their own, where a
// panic nothing recovers ends the program.
func (f *Filter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = f.recovered(ctx, info, p)
		}
	}()
	return next(ctx, info, st)
}

// recovered logs the panic p and returns the call's error.
func (f *Filter) recovered(ctx context.Context, info *kernel.CallInfo, p any) error {
	log := f.log
	if log == nil {
		log = slog.Default()
	}
	attrs := []slog.Attr{
		slog.String("side", info.Side.String()),
		slog.String("method", info.Method),
		slog.String("peer", info.Peer),
		slog.Any("panic", p),
	}
	if f.stack {
		attrs = append(attrs, slog.String("stack", string(debug.Stack())))
	}
	log.LogAttrs(ctx, slog.LevelError, "recover: a panic in the call chain became an Internal error", attrs...)
	return &kernel.Status{Code: kernel.Internal, Message: fmt.Sprintf("recover: %s panicked on the %s side: %v", info.Method, info.Side, p)}
}
