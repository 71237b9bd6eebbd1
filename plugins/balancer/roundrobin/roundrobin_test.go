package roundrobin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

func instances(n int) []kernel.Instance {
	out := make([]kernel.Instance, n)
	for i := range out {
		out[i] = kernel.Instance{Service: "echo", ID: fmt.Sprint("i", i), Address: fmt.Sprint("10.0.0.", i, ":7000")}
	}
	return out
}

// indexOf returns which element of set p points into, or -1.
func indexOf(set []kernel.Instance, p *kernel.Instance) int {
	for i := range set {
		if &set[i] == p {
			return i
		}
	}
	return -1
}

var info = &kernel.CallInfo{Method: "Echo.Say"}

func TestRegisteredUnderName(t *testing.T) {
	b, err := kernel.NewBalancer(Name, nil, "test")
	if err != nil {
		t.Fatalf("NewBalancer(%q): %v", Name, err)
	}
	if _, ok := b.(*Balancer); !ok {
		t.Errorf("NewBalancer(%q) built a %T", Name, b)
	}
	if _, err := kernel.NewBalancer(Name, map[string]any{"weights": true}, "test.yaml"); err == nil {
		t.Errorf("options given to a balancer that takes none: want an error, got nil")
	}
}

func TestPicksCycleExactlyThroughTheSet(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7} {
		t.Run(fmt.Sprint(n, " instances"), func(t *testing.T) {
			b := New()
			set := instances(n)
			b.Update(set)
			first, _ := b.Pick(context.Background(), info)
			start := indexOf(set, first)
			if start < 0 {
				t.Fatalf("Pick returned %p, not a pointer into the set given to Update", first)
			}
			counts := make([]int, n)
			counts[start]++
			for i := 1; i < 10*n; i++ {
				p, err := b.Pick(context.Background(), info)
				if err != nil {
					t.Fatalf("Pick %d: %v", i, err)
				}
				got, want := indexOf(set, p), (start+i)%n
				if got != want {
					t.Fatalf("pick %d went to instance %d, want %d (the one after the previous)", i, got, want)
				}
				counts[got]++
			}
			for i, c := range counts {
				if c != 10 {
					t.Errorf("instance %d picked %d times in %d picks, want 10", i, c, 10*n)
				}
			}
		})
	}
}

func TestPicksOnlyFromTheLatestUpdate(t *testing.T) {
	b := New()
	b.Update(instances(5))
	next := []kernel.Instance{{ID: "x", Address: "x:1"}, {ID: "y", Address: "y:1"}}
	b.Update(next)
	seen := map[string]int{}
	for range 10 {
		p, err := b.Pick(context.Background(), info)
		if err != nil {
			t.Fatal(err)
		}
		if indexOf(next, p) < 0 {
			t.Fatalf("picked %+v, which is not in the latest set", *p)
		}
		seen[p.ID]++
	}
	if seen["x"] != 5 || seen["y"] != 5 {
		t.Errorf("10 picks over [x y] = %v, want 5 each", seen)
	}
}

func TestNoInstances(t *testing.T) {
	cases := []struct {
		name   string
		update func(*Balancer)
	}{
		{"never updated", func(*Balancer) {}},
		{"updated with an empty set", func(b *Balancer) { b.Update(nil) }},
		{"updated to empty after having instances", func(b *Balancer) { b.Update(instances(2)); b.Update([]kernel.Instance{}) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			tc.update(b)
			p, err := b.Pick(context.Background(), info)
			if p != nil {
				t.Errorf("Pick = %+v, want nil", *p)
			}
			if !errors.Is(err, kernel.ErrNoInstances) {
				t.Fatalf("Pick error = %v, want one wrapping kernel.ErrNoInstances", err)
			}
			for _, want := range []string{"round-robin", "Echo.Say", "registered", "registry"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	if _, err := New().Pick(context.Background(), nil); !errors.Is(err, kernel.ErrNoInstances) {
		t.Errorf("Pick with nil info = %v, want ErrNoInstances", err)
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	b := New()
	b.Update(instances(3))
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := b.Pick(ctx, info); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Pick: %.1f allocations per call, want 0", allocs)
	}
}

func TestConcurrentPicksAndUpdates(t *testing.T) {
	b := New()
	sets := [][]kernel.Instance{instances(1), instances(3), instances(8)}
	b.Update(sets[0])
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				b.Update(sets[i%len(sets)])
			}
		}
	})
	var pickers sync.WaitGroup
	for range 4 {
		pickers.Go(func() {
			for range 2000 {
				p, err := b.Pick(context.Background(), info)
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				in := false
				for _, s := range sets {
					in = in || indexOf(s, p) >= 0
				}
				if !in || p.Address == "" {
					t.Errorf("Pick returned %+v, not an instance of any set", *p)
					return
				}
			}
		})
	}
	pickers.Wait()
	close(stop)
	wg.Wait()
}

func BenchmarkPick(b *testing.B) {
	bal := New()
	bal.Update(instances(8))
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bal.Pick(ctx, info); err != nil {
				b.Fatal(err)
			}
		}
	})
}
