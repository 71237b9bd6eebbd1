package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(serveEnv); spec != "" {
		if err := serveChild(spec, os.Stdout); err != nil {
			os.Stderr.WriteString("discovery server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every client, server and watch the demo starts must be gone once
	// it has returned.
	goleak.VerifyTestMain(m)
}

// The demo's promise: killing one of three servers moves its traffic to
// the other two within the TTL, and no call fails.
func TestKillingAServerMovesItsTraffic(t *testing.T) {
	var out bytes.Buffer
	rep, err := run(context.Background(), &out, options{duration: 7 * time.Second, killAfter: 2 * time.Second, callers: 4})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.failed != 0 {
		t.Errorf("%d of %d calls failed (first: %v); every call had a retry left", rep.failed, rep.calls, rep.firstErr)
	}
	for _, n := range names {
		if rep.before[n] == 0 {
			t.Errorf("server %s answered no call before the kill: %v", n, rep.before)
		}
	}
	if rep.after[rep.killed] != 0 {
		t.Errorf("the killed server answered %d calls after etcd dropped it", rep.after[rep.killed])
	}
	for _, n := range names {
		if n != rep.killed && rep.after[n] == 0 {
			t.Errorf("server %s answered no call after the kill: %v", n, rep.after)
		}
	}
	if rep.lastAnswer > rep.ttl {
		t.Errorf("the killed server answered %s after the kill, want its traffic moved within the %s TTL", rep.lastAnswer, rep.ttl)
	}
	// The lease lapses within its TTL; etcd checks leases on its own tick.
	if rep.gone == 0 || rep.gone > rep.ttl+time.Second {
		t.Errorf("etcd dropped the killed server %s after the kill, want within the %s TTL", rep.gone, rep.ttl)
	}
	if !strings.Contains(out.String(), "calls/s") {
		t.Errorf("no progress lines in the output:\n%s", out.String())
	}
}

// A run whose kill never comes (-kill-after at or past -duration), with
// no caller or no time to call, shows no failover: it is refused before
// anything starts. It ran, and its summary claimed that the server "answered no
// call after the kill; every call went to the others" of a kill that
// never happened, and exited 0.
func TestFlagsThatShowNoFailoverAreRefused(t *testing.T) {
	for _, o := range []options{
		{duration: time.Second, killAfter: 3 * time.Second, callers: 2},
		{duration: time.Second, killAfter: time.Second, callers: 2},
		{duration: 3 * time.Second, killAfter: time.Second, callers: 0},
		{duration: 0, killAfter: 0, callers: 2},
		{duration: 3 * time.Second, killAfter: -time.Second, callers: 2},
	} {
		var out bytes.Buffer
		if _, err := run(context.Background(), &out, o); err == nil || !strings.Contains(err.Error(), "-") {
			t.Errorf("%+v: run gave %v, want an error naming the flag\n%s", o, err, out.String())
		}
	}
}

// An interrupted demo did not show what it claims: run reports the
// interrupt rather than a summary main would exit 0 on.
func TestInterruptedDemoIsAnError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncbuf.CancelOn{At: "etcd lists all", Cancel: cancel}
	if _, err := run(ctx, out, options{duration: 10 * time.Second, killAfter: 5 * time.Second, callers: 2}); err == nil {
		t.Errorf("run interrupted before the kill gave no error:\n%s", out.String())
	}
}
