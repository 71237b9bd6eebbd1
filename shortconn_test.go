package kernrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
)

// A short connection (a client of its own per call: connect, call, close)
// is ordinary traffic: its setup and teardown log nothing at INFO or
// above, on either side.
func TestShortConnectionsLogNothingAtInfo(t *testing.T) {
	for _, transport := range []string{"tcp-lv", "shm-ring"} {
		t.Run(transport, func(t *testing.T) { shortConnections(t, transport) })
	}
}

func shortConnections(t *testing.T, transport string) {
	logs := enginetest.DefaultLog(t)

	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = transport, nil
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-observer", Side: "server"}}
	srv := startServer(t, cfg, nil)
	obs, _ := kernrpc.FindPlugin[*observer](srv.Plugins(), "test-observer")
	started := len(logs.String())
	for i := range 30 {
		cli, err := kernrpc.NewClient(cfg, cfg.Service)
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "short"}, &echopb.Echo{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if err := cli.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	// The server logs a connection's end once it reads it: wait for all.
	eventually(5*time.Second, func() bool { return obs.readings(t)["server_connections_open"].Value == 0 })
	if open := obs.readings(t)["server_connections_open"].Value; open > 0 {
		t.Fatalf("%v connections still open after every client closed", open)
	}
	if got := strings.TrimSpace(logs.String()[started:]); got != "" {
		t.Errorf("30 short connections logged at INFO or above:\n%s", got)
	}
}
