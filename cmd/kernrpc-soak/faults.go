package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// faultyTCP is the soak's third transport: tcp-lv through the faulty
// plugin on both sides, twice over. The outer layer loses or duplicates
// now and then a request, an answer or a cancel; the inner one delays
// every frame up to 1ms and now and then resets a connection instead of
// sending a frame, stream messages and credit included. Calls and
// streams on it may fail, by their deadline or with Unavailable, but must
// never get a wrong answer, and nothing they leave behind may grow.
//
// Stream messages are not lost or duplicated: the engine relies on the
// transport for that, as the kernel.Conn contract and plugintest require
// (a lost message is missing from the stream, a duplicate read twice).
const faultyTCP = "faulty"

// faultOptions are the faults: a request, an answer or a cancel is lost,
// or sent twice, with a chance of 0.2% each; any frame is held back up to
// 1ms, and resets its connection with a chance of 0.05%.
func faultOptions(seed uint64) map[string]any {
	streams := map[string]any{
		"transport":    map[string]any{"name": "tcp-lv"},
		"seed":         seed,
		"frames":       []any{"request", "response", "cancel", "stream_data", "window_update"},
		"reset":        0.0005,
		"delay_jitter": "1ms",
	}
	return map[string]any{
		"transport": map[string]any{"name": "faulty", "options": streams},
		"seed":      seed + 1,
		"frames":    []any{"request", "response", "cancel"},
		"drop":      0.002,
		"duplicate": 0.002,
	}
}

const (
	// faultyCallTimeout ends a call whose request or answer was lost.
	faultyCallTimeout = time.Second
	// faultyStreamTimeout ends a stream that lost a message or a window
	// update.
	faultyStreamTimeout = 3 * time.Second
)

// transportConfig is the plugin config of the soak's transport name.
func transportConfig(name string, seed uint64) kernrpc.PluginConfig {
	if name == faultyTCP {
		return kernrpc.PluginConfig{Name: "faulty", Options: faultOptions(seed)}
	}
	return kernrpc.PluginConfig{Name: name}
}

// faultEnded reports whether err is how a fault ends a call or stream:
// its deadline passed (a frame was lost), or its connection was reset.
func faultEnded(err error) bool {
	switch kernel.CodeOf(err) {
	case kernel.DeadlineExceeded, kernel.Unavailable:
		return true
	}
	return false
}

// faultLogs is a log handler that counts, rather than prints, what the
// engine logs below ERROR about the faulty service: faults are meant to
// make it warn (a duplicated request dropped, a connection reset), and
// those lines would bury the figures.
type faultLogs struct {
	slog.Handler
	faulty bool          // the logger's service is faultyTCP's
	hidden *atomic.Int64 // shared by the handlers WithAttrs derives
}

func newFaultLogs(h slog.Handler) *faultLogs {
	return &faultLogs{Handler: h, hidden: new(atomic.Int64)}
}

func (h *faultLogs) Handle(ctx context.Context, r slog.Record) error {
	if h.faulty && r.Level < slog.LevelError {
		h.hidden.Add(1)
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *faultLogs) WithAttrs(attrs []slog.Attr) slog.Handler {
	faulty := h.faulty
	for _, a := range attrs {
		faulty = faulty || a.Key == "service" && a.Value.String() == serviceOf(faultyTCP)
	}
	return &faultLogs{Handler: h.Handler.WithAttrs(attrs), faulty: faulty, hidden: h.hidden}
}

func (h *faultLogs) WithGroup(name string) slog.Handler {
	return &faultLogs{Handler: h.Handler.WithGroup(name), faulty: h.faulty, hidden: h.hidden}
}
