package accesslog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/accesslog"
)

// A handler's error that claims OK (a *kernel.Status with code OK) reaches
// the caller as Unknown, since an error is no answer: the server's line,
// of a call or of a stream, must say code=Unknown, as the client's does,
// not code=OK beside an err.
func TestAnErrorClaimingOKIsLoggedUnknown(t *testing.T) {
	out := enginetest.DefaultLog(t)
	cfg := enginetest.WithFilters(enginetest.Config(t), kernrpc.FilterConfig{Name: accesslog.Name})
	odd := &kernel.Status{Code: kernel.OK, Message: "an error that says OK"}
	enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Odd", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) { return nil, odd })
		kernrpc.HandleBidiStream(srv, "Chat.Odd", func(ctx context.Context, st echoStream) error { return odd })
	})
	cli := enginetest.Dial(t, cfg)
	if err := cli.Call(context.Background(), "Echo.Odd", &echopb.Echo{}, &echopb.Echo{}); kernel.CodeOf(err) != kernel.Unknown {
		t.Fatalf("Echo.Odd: %v, want Unknown", err)
	}
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](t.Context(), cli, "Chat.Odd")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); kernel.CodeOf(err) != kernel.Unknown {
		t.Fatalf("Chat.Odd: %v, want Unknown", err)
	}
	var lines []string
	for deadline := time.Now().Add(5 * time.Second); len(lines) < 4 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		lines = lines[:0]
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, "msg=call") || strings.Contains(l, "msg=stream") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4 (a call and a stream, each on both sides):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		t.Log(l)
		if !strings.Contains(l, "code=Unknown") {
			t.Errorf("line %q does not say code=Unknown, the code the caller got", l)
		}
	}
}
