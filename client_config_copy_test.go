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
