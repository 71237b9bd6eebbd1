package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// A rolling restart through a real etcd: instances come and go through
// the registry while 8 callers call; with drain_period 0 (the GoAways alone
// steer the client) and with a drain period (the watch does), no call
// fails.
func TestRollingRestartThroughEtcdLosesNoCall(t *testing.T) {
	srv := Start(t)
	for _, drain := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run("drain_period "+drain.String(), func(t *testing.T) {
			cfg := engineConfig(t, srv.Endpoint())
			cfg.Server.DrainPeriod = kernel.Duration(drain)
			live := []*backend{serve(t, cfg, false), serve(t, cfg, false)}
			cli, err := kernrpc.NewClient(cfg, cfg.Service)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cli.Close() })

			load := enginetest.StartLoad("calls", 8, func(int) error {
				return cli.Call(context.Background(), "Echo.Who", &echopb.Echo{}, &echopb.Echo{})
			})
			for range 5 {
				time.Sleep(100 * time.Millisecond)
				live = append(live, serve(t, cfg, false))
				time.Sleep(100 * time.Millisecond) // the watch hears of it
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := live[0].srv.Shutdown(ctx); err != nil {
					t.Errorf("shutdown: %v", err)
				}
				cancel()
				live = live[1:]
			}
			load.Stop()
			t.Logf("%s through 5 restarts", load)
			load.Check(t, 100)
		})
	}
}
