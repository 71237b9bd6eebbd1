package etcdtest

import (
	"fmt"
	"testing"
	"time"
)

// TestWipedEtcdIsFollowedAgain: etcd is wiped (stopped, and started again
// at the same address on an empty data directory, as a cluster rebuilt
// after a disaster) while a server and a client run on. The new cluster's
// revision starts again near 1, far behind the one the client's cache
// holds. The server registers its instance again under a new lease; a
// newcomer registers; the client's Watch and Resolve must show them, and
// no longer the instance whose process died meanwhile, within a generous
// bound, not only once the new cluster's revision has passed the old one.
func TestWipedEtcdIsFollowedAgain(t *testing.T) {
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	ctx := ctxFor(t)
	// The old cluster's history: its revision goes well past what the new
	// one will reach in this test.
	for i := range 200 {
		if _, err := cli.Put(ctx, "/unrelated/"+t.Name(), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	server := open(t, srv.Endpoint(), map[string]any{"ttl": "2s", "dial_timeout": "1s"})
	dying := open(t, srv.Endpoint(), map[string]any{"ttl": "2s", "dial_timeout": "1s"})
	client := open(t, srv.Endpoint(), map[string]any{"dial_timeout": "1s"})
	if err := server.Register(ctx, instance("echo", "a"), 0); err != nil {
		t.Fatal(err)
	}
	if err := dying.Register(ctx, instance("echo", "gone"), 0); err != nil {
		t.Fatal(err)
	}
	ch, err := client.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a", "gone"}, 5*time.Second, "before the wipe")
	shared := make(chan string, 100)
	if err := client.WatchShared(ctx, "k/", func(key string, value []byte) {
		shared <- fmt.Sprintf("%s=%s", key, value)
	}); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	dying.AbandonLeases() // its process dies while etcd is down
	srv.Wipe()
	wiped := time.Now()

	// The server finds its lease gone and registers again.
	for server.Stats().Reregistrations == 0 {
		if time.Since(wiped) > 15*time.Second {
			t.Fatalf("the server did not register again within 15s of the wipe; stats %+v", server.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the server registered again %s after the wipe", time.Since(wiped).Round(time.Millisecond))
	newcomer := open(t, srv.Endpoint(), nil)
	if err := newcomer.Register(ctx, instance("echo", "new"), 0); err != nil {
		t.Fatal(err)
	}
	if err := newcomer.PutShared(ctx, "k/x", []byte("1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := keys(t, cli, testPrefix(t)); len(got) != 2 {
		t.Fatalf("keys in the wiped etcd: %v; want the server's and the newcomer's", got)
	}
	awaitSet(t, ch, []string{"a", "new"}, 15*time.Second, "after etcd was wiped")
	resolveUntil(t, client, "echo", []string{"a", "new"}, 0, "after etcd was wiped")
	t.Logf("the client saw the wiped etcd's instances %s after the wipe; stats %+v", time.Since(wiped).Round(time.Millisecond), client.Stats())
	timer := time.NewTimer(15 * time.Second)
	defer timer.Stop()
	for {
		select {
		case got := <-shared:
			if got == "k/x=1" {
				return
			}
		case <-timer.C:
			t.Fatalf("the shared watch did not see k/x put on the wiped etcd within 15s")
		}
	}
}

// TestEtcdRestoredFromAnOlderBackup: etcd is restored from a backup taken
// before some instances were registered, while their servers run on. Its
// revision goes back to the backup's. An instance registered after the
// backup under a lease that is in the backup too (the lease lives on, its
// key is gone) must be written again by its server, one registered under
// a lease granted after the backup too (the lease is gone); and the
// client's Watch must follow the restored etcd.
func TestEtcdRestoredFromAnOlderBackup(t *testing.T) {
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	ctx := ctxFor(t)
	server := open(t, srv.Endpoint(), map[string]any{"ttl": "3s", "dial_timeout": "1s"})
	client := open(t, srv.Endpoint(), map[string]any{"dial_timeout": "1s"})
	if err := server.Register(ctx, instance("echo", "a"), 0); err != nil {
		t.Fatal(err)
	}
	ch, err := client.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a"}, 5*time.Second, "before the backup")
	backup := srv.Backup()

	// After the backup: b under the server's lease, which the backup
	// holds; c under a lease of another registry, which it does not; and
	// more history, so that the revision the client holds is well past
	// the backup's.
	if err := server.Register(ctx, instance("echo", "b"), 0); err != nil {
		t.Fatal(err)
	}
	late := open(t, srv.Endpoint(), map[string]any{"ttl": "3s", "dial_timeout": "1s"})
	if err := late.Register(ctx, instance("echo", "c"), 0); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := cli.Put(ctx, "/unrelated/"+t.Name(), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	awaitSet(t, ch, []string{"a", "b", "c"}, 5*time.Second, "before the restore")

	srv.RestoreBackup(backup)
	restored := time.Now()
	prefix := testPrefix(t)
	for {
		got := keys(t, cli, prefix)
		if len(got) == 3 {
			break
		}
		if time.Since(restored) > 15*time.Second {
			t.Fatalf("keys in the restored etcd 15s after the restore: %v; want a, b and c: their servers run on", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("every instance back in etcd %s after the restore", time.Since(restored).Round(time.Millisecond))
	awaitSet(t, ch, []string{"a", "b", "c"}, 15*time.Second, "after etcd was restored from an older backup")
	t.Logf("the client saw them %s after the restore; stats %+v", time.Since(restored).Round(time.Millisecond), client.Stats())
}
