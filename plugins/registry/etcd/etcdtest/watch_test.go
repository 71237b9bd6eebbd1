package etcdtest

import (
	"testing"
	"time"
)

// TestWatchResumesAfterAPartition: a watcher cut off from etcd while
// another registry changes the service gets every change once it is
// reconnected, by resuming its watch from its last revision: no second
// full read.
func TestWatchResumesAfterAPartition(t *testing.T) {
	srv := Start(t)
	proxy := startProxy(t, srv.Endpoint())
	watcher := open(t, proxy.Addr(), nil)
	writer := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	if err := writer.Register(ctx, instance("echo", "a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a"}, 5*time.Second, "before the partition")
	proxy.Cut()
	if err := writer.Register(ctx, instance("echo", "b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := writer.Deregister(ctx, instance("echo", "a")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	awaitSet(t, ch, []string{"b"}, 5*time.Second, "after the partition healed")
	if s := watcher.Stats(); s.FullReads != 1 {
		t.Errorf("stats %+v; want one full read: the watch resumes from its revision", s)
	}
}

// TestCompactionLeadsToOneReread: while a watcher is cut off, the service
// changes and etcd compacts its history past the watcher's revision. On
// reconnecting, the watcher reads the service whole, once, and follows it
// from there.
func TestCompactionLeadsToOneReread(t *testing.T) {
	srv := Start(t)
	proxy := startProxy(t, srv.Endpoint())
	cli := rawClient(t, srv.Endpoint())
	watcher := open(t, proxy.Addr(), nil)
	writer := open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	if err := writer.Register(ctx, instance("echo", "a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a"}, 5*time.Second, "before the partition")
	proxy.Cut()
	for _, id := range []string{"b", "c", "d"} {
		if err := writer.Register(ctx, instance("echo", id), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.Deregister(ctx, instance("echo", "b")); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "no-such-key")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatalf("compact at %d: %v", resp.Header.Revision, err)
	}
	proxy.Restore()
	awaitSet(t, ch, []string{"a", "c", "d"}, 5*time.Second, "after the partition healed, past a compaction")
	if s := watcher.Stats(); s.FullReads != 2 {
		t.Errorf("stats %+v; want two full reads: the first, and one after the compaction", s)
	}
	// The watch goes on from the re-read's revision.
	if err := writer.Register(ctx, instance("echo", "e"), time.Minute); err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a", "c", "d", "e"}, 5*time.Second, "after a registration following the re-read")
	if s := watcher.Stats(); s.FullReads != 2 {
		t.Errorf("stats %+v; want still two full reads", s)
	}
}
