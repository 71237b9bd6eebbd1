package kernrpc_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
)

// A client keeps the client options it was made with: a program that
// goes on to change the config, to make another client from it, does not
// change the first one's pools, which it makes on its first call to each
// instance, long after NewClient checked the options.
func TestAClientKeepsThePoolSizeItWasMadeWith(t *testing.T) {
	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
	srv := startServer(t, cfg, nil)
	obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	cfg.Filters = nil
	cli := newClient(t, cfg)                           // pool_size 1
	cfg.Client.PoolSize, cfg.Client.MaxPoolSize = 3, 3 // for a client made later
	for i := range 6 {
		var resp echopb.Echo
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &resp); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := obs.readings(t)["server_connections_accepted_total"].Value; n != 1 {
		t.Fatalf("the client made with pool_size 1 opened %v connections; want 1: it took up the pool_size set after it was made", n)
	}
}

// A client keeps the methods its filters were scoped to: a program that
// rewrites a pattern in the config, for a client made later, does not
// widen the first one's filter, whose chain for a method is built on that
// method's first call.
func TestAClientKeepsTheFilterMethodsItWasMadeWith(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) { kernrpc.Handle(s, "Echo.Secret", echo) })
	// test-deny denies Echo.Secret where it applies.
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-deny", Side: "client", Methods: []string{"Echo.Other"}}}
	cli := newClient(t, cfg)
	cfg.Filters[0].Methods[0] = "Echo.*" // for a client made later
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Secret", &echopb.Echo{Text: "x"}, &resp); err != nil {
		t.Fatalf("the client whose filter is scoped to Echo.Other denied Echo.Secret: %v; it took up the methods set after it was made", err)
	}
}

// A server keeps the config it was made with too: a program that makes
// a second server from the same config, renamed and with other metadata,
// before starting the first, does not change what the first registers.
func TestAServerKeepsTheConfigItWasMadeWith(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.Metadata = map[string]string{"zone": "a"}
	first, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	service := cfg.Service
	cfg.Service, cfg.Server.Metadata["zone"] = service+"-other", "b" // for a server made later
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Shutdown(context.Background()) })
	if in := first.Instance(); in.Service != service || in.Metadata["zone"] != "a" {
		t.Fatalf("the server made for %s in zone a registered %s in zone %q: it took up the config changed after it was made", service, in.Service, in.Metadata["zone"])
	}
}
