package etcdtest

import (
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/enginetest"
)

// A key under a service's prefix whose value is not a kernrpc instance
// (another tool's, or a damaged one) is left out of what Resolve and
// Watch give, with a WARN naming the service; an instance overwritten by
// such a value leaves the set.
func TestValuesThatAreNoInstanceAreSkipped(t *testing.T) {
	logs := enginetest.DefaultLog(t) // before open: the registry keeps slog.Default's logger
	srv := Start(t)
	cli := rawClient(t, srv.Endpoint())
	prefix := testPrefix(t)
	if _, err := cli.Put(ctxFor(t), prefix+"echo/junk", "not json"); err != nil {
		t.Fatal(err)
	}
	r := open(t, srv.Endpoint(), nil)
	if err := r.Register(ctxFor(t), instance("echo", "a"), 0); err != nil {
		t.Fatal(err)
	}
	resolveUntil(t, r, "echo", []string{"a"}, 5*time.Second, "with a value that is no instance beside a")
	ch, err := r.Watch(ctxFor(t), "echo")
	if err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{"a"}, 5*time.Second, "the watch's first set")
	if _, err := cli.Put(ctxFor(t), prefix+"echo/a", "{damaged"); err != nil {
		t.Fatal(err)
	}
	awaitSet(t, ch, []string{}, 5*time.Second, "after a's value was overwritten with one that is no instance")
	if !strings.Contains(logs.String(), `level=WARN msg="etcd: skipping a value that is not a kernrpc instance" registry=etcd`) ||
		!strings.Contains(logs.String(), "service=echo") {
		t.Errorf("the values skipped were not logged at WARN naming the service:\n%s", logs.String())
	}
}
