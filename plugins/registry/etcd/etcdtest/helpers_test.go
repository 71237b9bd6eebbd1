package etcdtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// testPrefix is a key prefix of t's own.
func testPrefix(t testing.TB) string {
	return "/kernrpc-test/" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + "/"
}

// open builds a registry through the plugin table, as a config would, on
// endpoint with t's prefix and the options given, closed when t ends.
func open(t testing.TB, endpoint string, options map[string]any) *etcd.Registry {
	t.Helper()
	opts := map[string]any{"endpoints": []any{endpoint}, "prefix": testPrefix(t), "dial_timeout": "2s"}
	maps.Copy(opts, options)
	r, err := kernel.NewRegistry(etcd.Name, opts, "test.yaml")
	if err != nil {
		t.Fatalf("NewRegistry: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r.(*etcd.Registry)
}

// rawClient is an etcd client of the test's own, to look at the keys the
// registry writes.
func rawClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func instance(service, id string) kernel.Instance {
	return kernel.Instance{Service: service, ID: id, Address: "127.0.0.1:" + fmt.Sprint(7000+len(id)),
		Metadata: map[string]string{"transport": "tcp-lv", "codec": "protobuf", "id": id}}
}

func ids(set []kernel.Instance) []string {
	out := make([]string, len(set))
	for i, in := range set {
		out[i] = in.ID
	}
	slices.Sort(out)
	return out
}

// resolveUntil polls r until service's IDs are want, failing t after d.
func resolveUntil(t testing.TB, r kernel.Registry, service string, want []string, d time.Duration, when string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(d)
	for {
		set, err := r.Resolve(ctxFor(t), service)
		if err != nil {
			t.Fatalf("Resolve(%s) %s: %v", service, when, err)
		}
		if got := ids(set); slices.Equal(got, want) {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("Resolve(%s) %s = %v after %s; want %v", service, when, got, d, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitSet reads ch until a set with exactly want's IDs arrives, failing t
// after d.
func awaitSet(t testing.TB, ch <-chan []kernel.Instance, want []string, d time.Duration, when string) []kernel.Instance {
	t.Helper()
	slices.Sort(want)
	timer := time.NewTimer(d)
	defer timer.Stop()
	var last []string
	for {
		select {
		case set, ok := <-ch:
			if !ok {
				t.Fatalf("watch channel closed %s; last set %v, want %v", when, last, want)
			}
			if last = ids(set); slices.Equal(last, want) {
				return set
			}
		case <-timer.C:
			t.Fatalf("watch %s: no set %v within %s; last set %v", when, want, d, last)
		}
	}
}

// keys returns the keys under prefix with their lease IDs.
func keys(t testing.TB, cli *clientv3.Client, prefix string) map[string]clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(ctxFor(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	out := make(map[string]clientv3.LeaseID, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = clientv3.LeaseID(kv.Lease)
	}
	return out
}

// putCounter counts the PUT events of every key under prefix, from a watch
// of a client of the test's own: what the registry writes, as etcd sees it.
type putCounter struct {
	cancel context.CancelFunc
	done   chan struct{}
	puts   map[string]int
	dels   map[string]int
}

func countPuts(t testing.TB, cli *clientv3.Client, prefix string) *putCounter {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	c := &putCounter{cancel: cancel, done: make(chan struct{}), puts: map[string]int{}, dels: map[string]int{}}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // created: events from here on are counted
	go func() {
		defer close(c.done)
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					c.puts[string(ev.Kv.Key)]++
				} else {
					c.dels[string(ev.Kv.Key)]++
				}
			}
		}
	}()
	t.Cleanup(func() { c.stop() })
	return c
}

// stop ends the count; the maps are stable after it.
func (c *putCounter) stop() {
	c.cancel()
	<-c.done
}
