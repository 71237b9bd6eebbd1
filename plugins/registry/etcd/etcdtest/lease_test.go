package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAbandonedInstancesExpireWithinTTL: a registry that stops renewing
// (its process "died") loses its instances within its TTL, for etcd itself
// and for the watchers of another registry; the other registry's instance
// stays.
func TestAbandonedInstancesExpireWithinTTL(t *testing.T) {
	const ttl = 2 * time.Second
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	dying := open(t, srv.Endpoint(), nil)
	living := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	for _, id := range []string{"d1", "d2"} {
		if err := dying.Register(ctx, instance("echo", id), ttl); err != nil {
			t.Fatal(err)
		}
	}
	if err := living.Register(ctx, instance("echo", "l"), ttl); err != nil {
		t.Fatal(err)
	}
	ch, err := living.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"d1", "d2", "l"}, 5*time.Second, "after registering")
	dying.AbandonLeases()
	start := time.Now()
	// etcd's lessor looks for expired leases every 500ms.
	awaitSet(t, ch, []string{"l"}, ttl+time.Second, "after the dying registry abandoned its lease")
	t.Logf("abandoned instances gone after %s (ttl %s)", time.Since(start).Round(time.Millisecond), ttl)
	if got := keys(t, cli, testPrefix(t)); len(got) != 1 {
		t.Errorf("keys %v; want only the living instance", got)
	}
	if err := dying.Register(ctx, instance("echo", "d3"), ttl); err == nil {
		t.Errorf("Register after AbandonLeases succeeded; a dead process registers nothing")
	}
	time.Sleep(ttl) // the living instance is kept alive meanwhile
	resolveUntil(t, living, "echo", []string{"l"}, 0, "one more ttl later")
}

// TestRestartedEtcd: etcd stops for longer than the TTL and starts again on
// the same data directory. Every live instance is registered again within
// one TTL, once (one write each, no duplicate keys, one lease); the watch
// of another registry resumes from its revision (no second full read) and
// sees a change made after the restart; while etcd is down, Resolve
// answers from the cache at once.
func TestRestartedEtcd(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	const n = 5
	srv := Start(t)
	prefix := testPrefix(t)
	// A grant that reaches etcd while it is still starting up can hang
	// for a whole dial_timeout before it is tried again: the promise of
	// one TTL holds for a dial_timeout well below it (a full -race run
	// once saw 2s hang, then 1s more, against a 3s TTL).
	r := open(t, srv.Endpoint(), map[string]any{"ttl": ttl.String(), "dial_timeout": "1s"})
	other := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	var want []string
	for i := range n {
		id := string(rune('a' + i))
		want = append(want, id)
		if err := r.Register(ctx, instance("echo", id), 0); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := other.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, want, 5*time.Second, "after registering")

	srv.Stop()
	start := time.Now()
	for range 100 {
		if set, err := other.Resolve(ctx, "echo"); err != nil || len(set) != n {
			t.Fatalf("Resolve with etcd down = %d instances, %v; want the cached %d", len(set), err, n)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("100 cached Resolves with etcd down took %s; they must not wait on etcd", took)
	}
	time.Sleep(ttl + 1500*time.Millisecond) // the client gives the lease up after a TTL unanswered
	srv.StartAgain()
	restarted := time.Now()

	cli := rawClient(t, srv.Endpoint())
	var got map[string]clientv3.LeaseID
	for {
		if r.Stats().Reregistrations == 1 {
			got = keys(t, cli, prefix)
			break
		}
		if time.Since(restarted) > ttl {
			t.Fatalf("instances not registered again %s after etcd restarted; stats %+v", ttl, r.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("registered again %s after etcd restarted (ttl %s)", time.Since(restarted).Round(time.Millisecond), ttl)
	checkOneLease(t, cli, got, prefix, n)

	// The old lease, which the restarted etcd extended, is gone or holds
	// nothing; after another TTL the instances are all still there.
	time.Sleep(ttl + time.Second)
	checkOneLease(t, cli, keys(t, cli, prefix), prefix, n)
	s := r.Stats()
	if s.Reregistrations != 1 || s.InstanceWrites != 2*n || s.LeaseGrants != 2 {
		t.Errorf("stats %+v; want 1 re-registration, %d instance writes (%d registrations, %d again), 2 leases", s, 2*n, n, n)
	}

	if err := r.Register(ctx, instance("echo", "z"), 0); err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, append(want, "z"), 5*time.Second, "after a registration once etcd was back")
	if s := other.Stats(); s.FullReads != 1 {
		t.Errorf("the watching registry read the service %d times; want once (a restart resumes the watch)", s.FullReads)
	}
}

// checkOneLease fails t unless got holds n keys under prefix, all on one
// live lease.
func checkOneLease(t *testing.T, cli *clientv3.Client, got map[string]clientv3.LeaseID, prefix string, n int) {
	t.Helper()
	leases := map[clientv3.LeaseID]bool{}
	for _, l := range got {
		leases[l] = true
	}
	if len(got) != n || len(leases) != 1 {
		t.Fatalf("keys under %s: %v; want %d, on one lease", prefix, got, n)
	}
	for l := range leases {
		if ttl, err := cli.TimeToLive(context.Background(), l); err != nil || ttl.TTL <= 0 {
			t.Errorf("lease %x: %+v, %v; want it alive", int64(l), ttl, err)
		}
	}
}

// TestSteadyKeepaliveWritesNothing: instances kept alive for a while (12s
// with a 2s TTL, a minute with -etcd.long) cost no etcd write after their
// registration: counted as puts per key by a watch on the prefix from a
// client of the test's own, and as etcd's revision, which every write of
// any key moves.
func TestSteadyKeepaliveWritesNothing(t *testing.T) {
	t.Parallel()
	const ttl, n = 2 * time.Second, 4
	period := 12 * time.Second
	if *long {
		period = time.Minute
	}
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	prefix := testPrefix(t)
	counter := countPuts(t, cli, prefix)
	r := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	for i := range n {
		if err := r.Register(ctx, instance("echo", string(rune('a'+i))), ttl); err != nil {
			t.Fatal(err)
		}
	}
	before, err := cli.Get(ctx, "no-such-key")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(period)
	after, err := cli.Get(ctxFor(t), "no-such-key") // ctx's 30s may be over
	if err != nil {
		t.Fatal(err)
	}
	counter.stop()
	total := 0
	for key, puts := range counter.puts {
		total += puts
		if puts != 1 {
			t.Errorf("%s was written %d times; want once, at registration", key, puts)
		}
	}
	if len(counter.puts) != n || len(counter.dels) != 0 {
		t.Errorf("puts %v, deletes %v; want %d keys put once and none deleted", counter.puts, counter.dels, n)
	}
	steady := total - n
	writesPerMinute := float64(steady) / float64(n) / period.Minutes()
	t.Logf("etcd writes per instance per minute in steady state: %.2f (%d instances, ttl %s, %s: %d puts in all, %d of them the registrations; etcd revision %d -> %d)",
		writesPerMinute, n, ttl, period, total, n, before.Header.Revision, after.Header.Revision)
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("etcd's revision moved from %d to %d during the steady period: something was written", before.Header.Revision, after.Header.Revision)
	}
	if s := r.Stats(); s.InstanceWrites != n || s.LeaseGrants != 1 || s.Reregistrations != 0 {
		t.Errorf("stats %+v; want %d writes, 1 lease, no re-registration", s, n)
	}
	resolveUntil(t, r, "echo", []string{"a", "b", "c", "d"}, 0, "after the steady period")
}
