package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
)

// limitedConfig is a kernrpc serve config whose server admits 5 calls at
// once and then 20 a second, refusing the rest with ResourceExhausted.
const limitedConfig = `service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: cmd-bench-limited}}
filters:
  - {name: token-bucket, side: server, options: {rate: 20, burst: 5}}
`

// A bench whose calls end in more than one code counts each, in code
// order (OK first), with the first message of each error code, and
// exits 0 since some calls succeeded.
func TestBenchCountsEachCode(t *testing.T) {
	addr := startServe(t, limitedConfig)
	r := runCmd("", "bench", addr, echoM, `{}`, "-c", "2", "-n", "200", "-d", "0", "-pool", "2")
	r.check(t, "bench over a rate limit", 0, "calls     200 (", "over its rate limit (20/s, burst 5")
	rows := regexp.MustCompile(`(?m)^(OK|ResourceExhausted)\s+(\d+)`).FindAllStringSubmatch(r.out, -1)
	if len(rows) != 2 || rows[0][1] != "OK" || rows[1][1] != "ResourceExhausted" {
		t.Fatalf("bench's codes table: rows %q, want OK then ResourceExhausted:\n%s", rows, r.out)
	}
	if rows[0][2] == "0" || rows[1][2] == "0" {
		t.Errorf("bench's codes table counts none of a code it lists:\n%s", r.out)
	}
}

// -pool N gives the bench's client N connections per instance, and one
// that works; the config's own pool size leaves the client as dial made
// it.
func TestBenchPool(t *testing.T) {
	addr := startServe(t, serveConfig)
	var d dialFlags
	d.timeout = 5 * time.Second
	for _, pool := range []int{0, 1, 3} {
		e, err := d.dialPool(addr, pool)
		if err != nil {
			t.Fatalf("dialPool(%d): %v", pool, err)
		}
		want := max(pool, 1)
		if got := e.cfg.Client.PoolSize; got != want {
			t.Errorf("dialPool(%d): client.pool_size %d, want %d", pool, got, want)
		}
		var resp echopb.Echo
		if err := e.cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "pool"}, &resp); err != nil || resp.Text != "pool" {
			t.Errorf("a call on the client of dialPool(%d): %q, %v", pool, resp.Text, err)
		}
		if e.source == nil || !strings.Contains(e.what, addr) {
			t.Errorf("dialPool(%d): source %v, target %q", pool, e.source, e.what)
		}
		e.Close()
	}
}
