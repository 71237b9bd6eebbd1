package etcdtest

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// TestKeysValuesAndOneLease: instances are <prefix><service>/<id> holding
// the documented JSON, all of a registry's under one lease of the largest
// ttl asked for; Resolve and Watch see them, and Deregister removes one.
func TestKeysValuesAndOneLease(t *testing.T) {
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	r := open(t, srv.Endpoint(), map[string]any{"ttl": "3s"})
	ctx := ctxFor(t)
	a, b := instance("echo", "a"), instance("echo", "b")
	a.Metadata["weight"] = "3"
	if err := r.Register(ctx, a, 0); err != nil { // the ttl option, 3s
		t.Fatal(err)
	}
	ch, err := r.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a"}, 5*time.Second, "after registering a")
	if err := r.Register(ctx, b, 1500*time.Millisecond); err != nil { // rounds up to 2s: less than the lease has
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a", "b"}, 5*time.Second, "after registering b")

	prefix := testPrefix(t)
	got := keys(t, cli, prefix)
	if len(got) != 2 || got[prefix+"echo/a"] == 0 || got[prefix+"echo/a"] != got[prefix+"echo/b"] {
		t.Fatalf("keys under %s = %v; want echo/a and echo/b under one lease", prefix, got)
	}
	lease := got[prefix+"echo/a"]
	ttl, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 3 {
		t.Errorf("lease granted for %ds; want 3 (the largest ttl asked for: the option's 3s over b's 1.5s)", ttl.GrantedTTL)
	}

	resp, err := cli.Get(ctx, prefix+"echo/a")
	if err != nil {
		t.Fatal(err)
	}
	var value struct {
		Address  string            `json:"address"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &value); err != nil {
		t.Fatalf("value %s is not JSON: %v", resp.Kvs[0].Value, err)
	}
	if value.Address != a.Address || !maps.Equal(value.Metadata, a.Metadata) {
		t.Errorf("value = %s; want address %s and metadata %v", resp.Kvs[0].Value, a.Address, a.Metadata)
	}

	// A longer ttl moves every instance to a new, longer lease.
	c := instance("echo", "c")
	if err := r.Register(ctx, c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	got = keys(t, cli, prefix)
	if len(got) != 3 || got[prefix+"echo/a"] == lease || got[prefix+"echo/a"] != got[prefix+"echo/c"] || got[prefix+"echo/b"] != got[prefix+"echo/c"] {
		t.Fatalf("after registering c with 5s: keys %v; want a, b and c under one new lease (old %x)", got, lease)
	}
	if ttl, err := cli.TimeToLive(ctx, got[prefix+"echo/c"]); err != nil || ttl.GrantedTTL != 5 {
		t.Errorf("new lease: %+v, %v; want granted 5s", ttl, err)
	}
	if old, err := cli.TimeToLive(ctx, lease); err != nil || old.TTL != -1 {
		t.Errorf("old lease after the move: %+v, %v; want it revoked", old, err)
	}

	if err := r.Deregister(ctx, a); err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"b", "c"}, 5*time.Second, "after deregistering a")
	resolveUntil(t, r, "echo", []string{"b", "c"}, time.Second, "after deregistering a")
}

// TestLoadReportsAreRateLimited: reports every 50ms with a 500ms interval
// write at most one value per interval (plus the registration), and the
// last report is the one that ends up in etcd.
func TestLoadReportsAreRateLimited(t *testing.T) {
	const interval, every, period = 500 * time.Millisecond, 50 * time.Millisecond, 3 * time.Second
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	prefix := testPrefix(t)
	counter := countPuts(t, cli, prefix)
	r := open(t, srv.Endpoint(), map[string]any{"load_report_interval": interval.String()})
	reader := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	in := instance("echo", "a")
	if err := r.Register(ctx, in, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var last kernel.Load
	for i := int64(1); time.Since(start) < period; i++ {
		last = kernel.Load{InFlight: i, QPS: float64(i) / 2, Updated: time.Now().Truncate(time.Millisecond)}
		if err := r.ReportLoad(ctx, in, last); err != nil {
			t.Fatalf("ReportLoad: %v", err)
		}
		time.Sleep(every)
	}
	time.Sleep(interval + 200*time.Millisecond) // the coalesced last report is written
	counter.stop()
	puts := counter.puts[prefix+"echo/a"]
	maxPuts := 1 + int(time.Since(start)/interval) + 1
	t.Logf("%d reports in %s, load_report_interval %s: %d writes (registration included): %.0f writes per instance per minute",
		int(period/every), period, interval, puts, float64(puts-1)/time.Since(start).Minutes())
	if puts < 3 || puts > maxPuts {
		t.Errorf("%d puts of the instance; want between 3 and %d (one per interval at most)", puts, maxPuts)
	}
	set, err := reader.Resolve(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 1 || set[0].Load.InFlight != last.InFlight || set[0].Load.QPS != last.QPS || !set[0].Load.Updated.Equal(last.Updated) {
		t.Errorf("resolved %+v; want the last load reported, %+v", set, last)
	}
	if got := keys(t, cli, prefix); len(got) != 1 {
		t.Errorf("keys %v; want the one instance", got)
	}
}

// TestMetadataThatIsNotUTF8IsRefused: the value is JSON, whose encoder
// turns every byte that is not UTF-8 into U+FFFD; an instance whose
// metadata or address has such bytes would resolve with other values than
// it was registered with. Register refuses it instead, as consul's does,
// and registers nothing.
func TestMetadataThatIsNotUTF8IsRefused(t *testing.T) {
	srv := Start(t)
	r := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	for name, in := range map[string]kernel.Instance{
		"metadata value": {Service: "echo", ID: "a", Address: "127.0.0.1:1", Metadata: map[string]string{"bin": "\xff\xfe"}},
		"metadata key":   {Service: "echo", ID: "b", Address: "127.0.0.1:2", Metadata: map[string]string{"k\xff": "v"}},
		"address":        {Service: "echo", ID: "c", Address: "127.0.0.1:\xff"},
	} {
		err := r.Register(ctx, in, time.Minute)
		if err == nil {
			set, rerr := r.Resolve(ctx, "echo")
			for _, got := range set {
				if got.ID == in.ID && (got.Address != in.Address || !maps.Equal(got.Metadata, in.Metadata)) {
					t.Errorf("%s not UTF-8: registered as %q %q, resolves as %q %q; want it refused", name, in.Address, in.Metadata, got.Address, got.Metadata)
				}
			}
			if rerr != nil {
				t.Fatal(rerr)
			}
			continue
		}
		if !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("Register with a %s that is not UTF-8: %v; want an error saying so", name, err)
		}
	}
	resolveUntil(t, r, "echo", nil, 0, "after the refusals")
}
