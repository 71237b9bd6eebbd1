package kernrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
)

// A server at max_connections accepts a spare the client dials to spread
// large calls, then refuses it with a GoAway. That refusal is the spare's
// dial failing by other means: as after a spreading dial that fails, the
// client goes on over the connection it has and holds off spreading for
// a while, rather than dialling a spare for every loaded call that
// follows, each refused in turn (and the call written there sent again).
func TestARefusedSpareIsNotDialledAgainForEveryCall(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.MaxConnections = 1
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
	entered := make(chan struct{}, 8)
	release := make(chan struct{})
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Hold", holding(entered, release))
	})
	obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	cfg.Filters = nil
	cli := newClient(t, cfg)
	errs := holdTwoLarge(t, cli, entered)
	payload := make([]byte, 64<<10)
	// The second held call found the connection loaded and dialled a
	// spare, which the server refused.
	waitFor(t, func() bool { return obs.readings(t)["server_connections_refused_total"].Value >= 1 }, "refused spare")
	// While the held calls keep the connection loaded, more large calls
	// go through on it.
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var resp echopb.Echo
		err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Payload: payload}, &resp)
		cancel()
		if err != nil || len(resp.Payload) != len(payload) {
			t.Fatalf("call %d while the server refuses spares: %v", i, err)
		}
		time.Sleep(5 * time.Millisecond) // a refusal takes a moment to be read
	}
	close(release)
	for range 2 {
		if err := receive(t, errs, 5*time.Second, "a held call did not return"); err != nil {
			t.Fatal(err)
		}
	}
	// 20 calls over some 100-300 ms: one spare refused, perhaps a second
	// once the hold-off (a second) is over on a slow machine.
	if n := obs.readings(t)["server_connections_refused_total"].Value; n > 2 {
		t.Errorf("the server refused %v spare connections over 20 calls; want at most 2: the client dials a spare again for every loaded call", n)
	}
}
