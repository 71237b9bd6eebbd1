package etcdtest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kernrpc/kernrpc/kernel"
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

// TestResumeBeyondOneBatchMissesNothing: a watcher cut off while more
// than a thousand revisions change its service gets them, on resuming,
// in batches: etcd sends an unsynced watcher the events of at most 1000
// revisions at a time, each batch under the header revision etcd is at
// now, past the events the batch holds. The cache must follow the events,
// not that header, or every change of the later batches is taken as
// already seen and dropped: instances registered meanwhile never show.
func TestResumeBeyondOneBatchMissesNothing(t *testing.T) {
	srv := Start(t)
	proxy := startProxy(t, srv.Endpoint())
	cli := rawClient(t, srv.Endpoint())
	watcher := open(t, proxy.Addr(), nil)
	ctx := ctxFor(t)
	prefix := testPrefix(t) + "echo/"
	ch, err := watcher.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, nil, 5*time.Second, "before the partition")
	proxy.Cut()
	const n = 1100
	putMany(t, cli, prefix, n, `{"address":"127.0.0.1:1"}`)
	proxy.Restore()
	// The first batch shows; a change made after it must come with every
	// instance of the batches after it too.
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for got := 0; got < 1000; {
		select {
		case set := <-ch:
			got = len(set)
		case <-timer.C:
			t.Fatalf("no set of the first batch's 1000 instances after the partition healed")
		}
	}
	if _, err := cli.Put(ctx, prefix+"last", `{"address":"127.0.0.1:2"}`); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case set := <-ch:
			if !slices.ContainsFunc(set, func(in kernel.Instance) bool { return in.ID == "last" }) {
				continue
			}
			if len(set) != n+1 {
				t.Fatalf("set after the partition healed and %q was put: %d instances; want all %d put meanwhile, and %q", "last", len(set), n, "last")
			}
			set, err := watcher.Resolve(ctx, "echo")
			if err != nil || len(set) != n+1 {
				t.Fatalf("Resolve: %d instances, %v; want %d", len(set), err, n+1)
			}
			return
		case <-timer.C:
			t.Fatalf("no set with %q after it was put", "last")
		}
	}
}

// putMany puts n keys <prefix>iNNNN holding value, each a revision of
// its own, from a few goroutines.
func putMany(t *testing.T, cli *clientv3.Client, prefix string, n int, value string) {
	t.Helper()
	const writers = 8
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				if _, err := cli.Put(ctx, fmt.Sprintf("%si%04d", prefix, i), value); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("put: %v", err)
	}
}
