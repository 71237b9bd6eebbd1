package accesslog

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// A next that panics (a handler: the engine answers it Internal above the
// chain) is a failed call or stream: it gets its line, at error_level with
// code Internal, even with sampling off, and the panic goes on up.
func TestPanickingCallsAndStreamsAreLogged(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0}, &out)
	mustPanic := func(what string, run func()) {
		t.Helper()
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("%s: recovered %v, want the handler's panic to go on up", what, p)
			}
		}()
		run()
	}
	mustPanic("call", func() {
		call(f, kernel.ServerSide, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { panic("handler bug") })
	})
	mustPanic("stream", func() {
		stream(f, kernel.ServerSide, &memStream{}, func(context.Context, *kernel.CallInfo, kernel.Stream) error { panic("handler bug") })
	})
	got := out.all(t)
	if len(got) != 2 {
		t.Fatalf("%d lines, want one for the call and one for the stream: %v", len(got), got)
	}
	for i, msg := range []string{"call", "stream"} {
		l := got[i]
		for k, want := range map[string]any{"level": "WARN", "msg": msg, "side": "server", "code": "Internal"} {
			if l[k] != want {
				t.Errorf("%s: %s = %v, want %v (line %v)", msg, k, l[k], want, l)
			}
		}
		if _, ok := l["err"]; !ok {
			t.Errorf("%s: no err: %v", msg, l)
		}
	}
}
