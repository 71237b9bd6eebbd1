package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Watches: the current set first, then every change, the latest set to a
// slow watcher, and an end when the registry closes.

func TestWatch(t *testing.T) {
	r := open(t, nil)
	mustRegister(t, r, inst("echo", "a"), time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := r.Watch(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(receive(t, w, time.Second)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("first set = %v, want the current set [a]", got)
	}
	mustRegister(t, r, inst("echo", "b"), time.Minute)
	if got := ids(receive(t, w, time.Second)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("after adding b: %v, want [a b]", got)
	}
	mustRegister(t, r, inst("unrelated", "z"), time.Minute)
	if err := r.Deregister(context.Background(), inst("echo", "a")); err != nil {
		t.Fatal(err)
	}
	if got := ids(receive(t, w, time.Second)); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after removing a: %v, want [b] (and no set for another service)", got)
	}
	cancel()
	select {
	case set, ok := <-w:
		if ok {
			t.Errorf("after cancel: received %v, want the channel closed", ids(set))
		}
	case <-time.After(time.Second):
		t.Fatal("channel not closed within 1s of ctx being cancelled")
	}
}

func TestWatchOfEmptyServiceSendsEmptySet(t *testing.T) {
	r := open(t, nil)
	w, err := r.Watch(t.Context(), "nobody")
	if err != nil {
		t.Fatal(err)
	}
	if set := receive(t, w, time.Second); len(set) != 0 {
		t.Errorf("first set = %v, want empty", ids(set))
	}
}

func TestSlowWatcherSeesOnlyTheLatestSet(t *testing.T) {
	r := open(t, nil)
	w, err := r.Watch(t.Context(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	// Nobody reads while 50 changes happen: the store must not block.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 50 {
			if err := r.Register(context.Background(), inst("echo", fmt.Sprintf("i%02d", i)), time.Minute); err != nil {
				t.Errorf("Register: %v", err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Register blocked on a watcher that does not read")
	}
	set := receive(t, w, time.Second)
	if len(set) != 50 {
		t.Errorf("slow receiver got a set of %d, want the latest (50)", len(set))
	}
	select {
	case stale := <-w:
		t.Errorf("after the latest set, another set of %d was pending", len(stale))
	default:
	}
}

func TestWatchSetsAreIndependent(t *testing.T) {
	r := open(t, nil)
	mustRegister(t, r, inst("echo", "a"), time.Minute)
	w1, _ := r.Watch(t.Context(), "echo")
	w2, _ := r.Watch(t.Context(), "echo")
	s1, s2 := receive(t, w1, time.Second), receive(t, w2, time.Second)
	s1[0].ID = "scribbled"
	if s2[0].ID != "a" {
		t.Errorf("two watchers share a slice: changing one changed the other to %q", s2[0].ID)
	}
}

func TestCloseDeregistersAndEndsWatches(t *testing.T) {
	ctx := context.Background()
	a := open(t, map[string]any{"namespace": "ns-" + t.Name()})
	b := open(t, map[string]any{"namespace": "ns-" + t.Name()})
	mustRegister(t, a, inst("echo", "a1"), time.Minute)
	mustRegister(t, a, inst("echo", "a2"), time.Minute)
	mustRegister(t, b, inst("echo", "b1"), time.Minute)
	// b takes over a2's lease: a's Close must leave it alone.
	mustRegister(t, b, inst("echo", "a2"), time.Minute)
	aw, _ := a.Watch(context.Background(), "echo")

	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got, want := resolveIDs(t, b, "echo"), []string{"a2", "b1"}; !slices.Equal(got, want) {
		t.Errorf("after a.Close: %v, want %v", got, want)
	}
	// The watch started through a ends with a, although its ctx never does.
	for range aw {
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v, want nil (idempotent)", err)
	}
	ops := map[string]error{
		"Register":   a.Register(ctx, inst("echo", "late"), time.Minute),
		"Deregister": a.Deregister(ctx, inst("echo", "b1")),
		"ReportLoad": a.ReportLoad(ctx, inst("echo", "b1"), kernel.Load{InFlight: 1}),
	}
	_, ops["Resolve"] = a.Resolve(ctx, "echo")
	_, ops["Watch"] = a.Watch(ctx, "echo")
	for op, err := range ops {
		if !errors.Is(err, kernel.ErrClosed) {
			t.Errorf("%s after Close = %v, want an error wrapping kernel.ErrClosed", op, err)
		}
	}
}
