package kernrpc

import (
	"log/slog"
	"sync"
)

// lazyLogger is base.With(args...) made the first time something is
// logged: a short-lived client that logs nothing does not pay for With,
// which was a fifth of NewClient. base is taken when the owner is made, so
// a later slog.SetDefault does not change where it logs.
type lazyLogger struct {
	base *slog.Logger
	args []any
	once sync.Once
	l    *slog.Logger
}

func (l *lazyLogger) get() *slog.Logger {
	l.once.Do(func() { l.l = l.base.With(l.args...) })
	return l.l
}
