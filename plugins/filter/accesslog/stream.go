package accesslog

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

var _ kernel.StreamFilter = (*Filter)(nil)

// InvokeStream passes the stream on, counting the messages each way, and
// logs one line when it ends, by the rules a call's line follows: a
// failed stream always, a successful one if slow or sampled.
func (f *Filter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	start := time.Now()
	counted := &countedStream{Stream: st, sizes: f.mayLog(ctx)}
	// A next that panics (a handler: the engine turns its panic into
	// Internal) is a failed stream, which is always logged; the panic
	// goes on up.
	returned := false
	defer func() {
		if !returned {
			f.streamLine(ctx, f.errorLevel, info, counted, panicked(info), time.Since(start))
		}
	}()
	err := next(ctx, info, counted)
	returned = true
	took := time.Since(start)
	level := f.errorLevel
	if err == nil {
		if (f.slow == 0 || took < f.slow) && (f.sample == 0 || (f.sample < 1 && f.rand() >= f.sample)) {
			return nil
		}
		level = f.level
	}
	f.streamLine(ctx, level, info, counted, err, took)
	return err
}

// mayLog reports whether a line at either of the filter's levels would be
// written: only then are the messages' sizes worth adding up.
func (f *Filter) mayLog(ctx context.Context) bool {
	return f.logger().Enabled(ctx, min(f.level, f.errorLevel))
}

// streamLine logs one stream.
func (f *Filter) streamLine(ctx context.Context, level slog.Level, info *kernel.CallInfo, c *countedStream, err error, took time.Duration) {
	log := f.logger()
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String("side", info.Side.String()), slog.String("method", info.Method), slog.String("peer", info.Peer))
	if info.Side == kernel.ClientSide && info.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", info.Attempt))
	}
	attrs = append(attrs, slog.String("code", kernel.CodeOf(err).String()), slog.Duration("duration", took),
		slog.Int64("sent_msgs", c.sent.Load()), slog.Int64("recv_msgs", c.received.Load()))
	if c.sizes {
		if !c.sentUnsized.Load() {
			attrs = append(attrs, slog.Int64("sent_bytes", c.sentBytes.Load()))
		}
		if !c.receivedUnsized.Load() {
			attrs = append(attrs, slog.Int64("recv_bytes", c.receivedBytes.Load()))
		}
	}
	if err != nil {
		attrs = append(attrs, errAttr(err))
	}
	log.LogAttrs(ctx, level, "stream", attrs...)
}

// countedStream counts the messages that pass, and with sizes adds up
// the sizes they report of themselves (see size). One goroutine may send
// while another receives, so every figure is atomic; a direction in which
// some message reports no size has no byte count.
type countedStream struct {
	kernel.Stream
	sizes                        bool
	sent, received               atomic.Int64
	sentBytes, receivedBytes     atomic.Int64
	sentUnsized, receivedUnsized atomic.Bool
}

func (s *countedStream) SendMsg(m any) error {
	err := s.Stream.SendMsg(m)
	if err == nil {
		s.sent.Add(1)
		s.count(m, &s.sentBytes, &s.sentUnsized)
	}
	return err
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.Stream.RecvMsg(m)
	if err == nil {
		s.received.Add(1)
		s.count(m, &s.receivedBytes, &s.receivedUnsized)
	}
	return err
}

func (s *countedStream) count(m any, bytes *atomic.Int64, unsized *atomic.Bool) {
	if !s.sizes {
		return
	}
	if n, ok := size(m); ok {
		bytes.Add(int64(n))
	} else {
		unsized.Store(true)
	}
}
