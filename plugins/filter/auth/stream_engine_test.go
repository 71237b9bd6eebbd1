package auth_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/echostream"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/auth"
)

type echoStream = kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]

// Over the engine (tcp-lv): a client with the filter opens bidirectional
// and server-streaming streams with its token; a client without one, or
// with a wrong one, is refused when its stream opens, with the same
// answer a refused unary call gets, and the handlers never run for it.
func TestStreamsOverTheEngine(t *testing.T) {
	server := enginetest.WithFilters(enginetest.Config(t), kernrpc.FilterConfig{Name: auth.Name, Side: "server", Options: map[string]any{
		"tokens": []any{staticToken},
	}})
	var handled atomic.Int32
	enginetest.Serve(t, server, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Who", func(context.Context, *echopb.Echo) (*echopb.Echo, error) {
			handled.Add(1)
			return &echopb.Echo{Text: "welcome"}, nil
		})
		kernrpc.HandleBidiStream(srv, "Watch.Echo", func(ctx context.Context, st echoStream) error {
			handled.Add(1)
			return echostream.Serve(ctx, st)
		})
		kernrpc.HandleServerStream(srv, "Watch.Count", func(ctx context.Context, req *echopb.Echo, st echoStream) error {
			handled.Add(1)
			for i := range 3 {
				if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i)}); err != nil {
					return err
				}
			}
			return nil
		})
	})
	ctx := t.Context()

	withToken := enginetest.Dial(t, enginetest.WithFilters(server, kernrpc.FilterConfig{Name: auth.Name, Side: "client", Options: map[string]any{"token": staticToken}}))
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, withToken, "Watch.Echo")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i)}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if m, err := st.Recv(); err != nil || m.Text != strconv.Itoa(i) {
			t.Fatalf("echo %d: %v, %v", i, m, err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the end of a stream with a valid token: %v, want io.EOF", err)
	}
	counted := 0
	cs, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, withToken, "Watch.Count", &echopb.Echo{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := cs.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("server stream with a valid token: %v", err)
		}
		counted++
	}
	if counted != 3 {
		t.Errorf("server stream: %d messages, want 3", counted)
	}

	before := handled.Load()
	bare := enginetest.Dial(t, server)
	unaryErr := bare.Call(ctx, "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(unaryErr) != kernel.Unauthenticated {
		t.Fatalf("a unary call without a token: %v, want Unauthenticated", unaryErr)
	}
	wantMessage := func(method string) string {
		return `auth: ` + method + ` needs a valid bearer token in request metadata "authorization"`
	}
	if got := kernel.StatusOf(unaryErr).Message; got != wantMessage("Echo.Who") {
		t.Fatalf("unary refusal %q, want %q", got, wantMessage("Echo.Who"))
	}
	for _, tc := range []struct {
		name string
		md   kernel.Metadata
	}{
		{"no token", nil},
		{"wrong token", kernel.Metadata{"authorization": "Bearer not-" + staticToken}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sctx := ctx
			if tc.md != nil {
				sctx = kernrpc.WithMetadata(ctx, tc.md)
			}
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](sctx, bare, "Watch.Echo")
			if err != nil {
				t.Fatalf("open: %v (the refusal comes with the stream's end, not at the opening)", err)
			}
			_, err = st.Recv()
			if kernel.CodeOf(err) != kernel.Unauthenticated || kernel.StatusOf(err).Message != wantMessage("Watch.Echo") {
				t.Errorf("bidi stream: %v; want Unauthenticated saying %q, as a refused call does", err, wantMessage("Watch.Echo"))
			}
			cs, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](sctx, bare, "Watch.Count", &echopb.Echo{})
			if err == nil {
				_, err = cs.Recv()
			}
			if kernel.CodeOf(err) != kernel.Unauthenticated || kernel.StatusOf(err).Message != wantMessage("Watch.Count") {
				t.Errorf("server stream: %v; want Unauthenticated saying %q", err, wantMessage("Watch.Count"))
			}
		})
	}
	if n := handled.Load() - before; n != 0 {
		t.Errorf("handlers ran %d times for streams and calls without a valid token, want 0", n)
	}
}
