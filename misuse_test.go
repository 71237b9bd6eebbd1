package kernrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
)

// Registering wrongly is an error that names the method and says what to
// do: an empty name, a name taken, or a server already started. Handle
// and HandleServerStream, which return nothing, panic with that error,
// as http.HandleFunc does.
func TestRegisterMisuse(t *testing.T) {
	cfg := testConfig(t)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	newReq := func() any { return new(echopb.Echo) }
	h := func(_ context.Context, req any) (any, error) { return req, nil }
	if err := srv.Register("", newReq, h); err == nil || !strings.Contains(err.Error(), "empty method name") {
		t.Errorf("an empty method name: %v", err)
	}
	if err := srv.Register("Echo.Echo", newReq, h); err != nil {
		t.Fatal(err)
	}
	if err := srv.Register("Echo.Echo", newReq, h); err == nil || !strings.Contains(err.Error(), `Register "Echo.Echo": method registered twice`) {
		t.Errorf("a method registered twice: %v", err)
	}
	mustPanic(t, `Register "Echo.Echo": method registered twice`, func() { kernrpc.Handle(srv, "Echo.Echo", echo) })
	mustPanic(t, `Register "Echo.Echo": method registered twice`, func() {
		kernrpc.HandleServerStream(srv, "Echo.Echo", func(context.Context, *echopb.Echo, kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			return nil
		})
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	want := `Register "Echo.Late": the server has started; register every method before Start`
	if err := srv.Register("Echo.Late", newReq, h); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a method registered after Start: %v", err)
	}
	mustPanic(t, want, func() { kernrpc.Handle(srv, "Echo.Late", echo) })
	if got := strings.Join(srv.Methods(), " "); strings.Contains(got, "Echo.Late") {
		t.Errorf("methods after the refused registrations: %s", got)
	}
}

// A server starts once; a client needs a service to call. Either misuse
// is an error that says so, not a second listener or a client that
// cannot resolve anything.
func TestStartTwiceAndAClientWithoutService(t *testing.T) {
	srv := startServer(t, testConfig(t), nil)
	if err := srv.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "the server has already started") {
		t.Errorf("a second Start: %v", err)
	}
	cfg := testConfig(t)
	cfg.Service = ""
	if cli, err := kernrpc.NewClient(cfg, ""); err == nil || !strings.Contains(err.Error(), "no service to call: pass its name or set service in the config") {
		if cli != nil {
			cli.Close()
		}
		t.Errorf("NewClient without a service: %v", err)
	}
}

// mustPanic runs f and checks that it panics with an error or string
// containing want.
func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		var msg string
		switch v := r.(type) {
		case error:
			msg = v.Error()
		case string:
			msg = v
		}
		if !strings.Contains(msg, want) {
			t.Errorf("panicked with %v; want a panic containing %q", r, want)
		}
	}()
	f()
}
