package consistenthash_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/consistenthash"
)

func set(ids ...string) []kernel.Instance {
	out := make([]kernel.Instance, len(ids))
	for i, id := range ids {
		out[i] = kernel.Instance{Service: "echo", ID: id, Address: id + ".invalid:7000"}
	}
	return out
}

func numbered(n int) []kernel.Instance {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("echo@10.0.0.%d:7000", i)
	}
	return set(ids...)
}

func build(t testing.TB, o *consistenthash.Options) *consistenthash.Balancer {
	t.Helper()
	b, err := consistenthash.New(*o)
	if err != nil {
		t.Fatalf("New(%+v): %v", *o, err)
	}
	return b
}

func keyed(key string) *kernel.CallInfo {
	return &kernel.CallInfo{Method: "Echo.Say", Metadata: kernel.Metadata{"x-hash-key": key}}
}

// owners maps each of keys to the ID of the instance b picks for it, and
// checks that every pick points into s.
func owners(t *testing.T, b kernel.Balancer, s []kernel.Instance, keys []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		p, err := b.Pick(context.Background(), keyed(k))
		if err != nil {
			t.Fatalf("Pick for key %q: %v", k, err)
		}
		i := -1
		for j := range s {
			if &s[j] == p {
				i = j
			}
		}
		if i < 0 {
			t.Fatalf("Pick for key %q = %+v, not a pointer into the set given to Update", k, *p)
		}
		out[k] = p.ID
	}
	return out
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("user-%d", i)
	}
	return out
}

func TestSameKeySameInstanceWhateverTheOrderOfTheSet(t *testing.T) {
	b := build(t, consistenthash.DefaultOptions())
	s := numbered(7)
	b.Update(s)
	ks := keys(2000)
	first := owners(t, b, s, ks)
	if again := owners(t, b, s, ks); !mapsEqual(first, again) {
		t.Fatalf("the same keys went to other instances on a second round of picks")
	}
	shuffled := slices.Clone(s)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	other := build(t, consistenthash.DefaultOptions()) // another client
	other.Update(shuffled)
	if got := owners(t, other, shuffled, ks); !mapsEqual(first, got) {
		t.Fatalf("a client given the same set in another order sends keys elsewhere")
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The ring must be the same in every process and every version, or clients
// of one service disagree on where a key goes: these owners were computed
// once from the algorithm the package doc describes.
func TestRingIsPinned(t *testing.T) {
	b := build(t, consistenthash.DefaultOptions())
	s := set("a", "b", "c", "d", "e")
	b.Update(s)
	got := owners(t, b, s, []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"})
	want := map[string]string{"k0": "a", "k1": "a", "k2": "a", "k3": "b", "k4": "c", "k5": "d", "k6": "b", "k7": "d", "k8": "c", "k9": "a"}
	if !mapsEqual(got, want) {
		t.Errorf("owners of k0..k9 over a..e = %v, want %v: the ring changed, which moves keys between clients of different versions", got, want)
	}
}

func TestFNV1aMatchesHashFNV(t *testing.T) {
	for _, s := range append(keys(100), "", "a", "foobar", strings.Repeat("\xff", 300)) {
		h := fnv.New64a()
		h.Write([]byte(s))
		if got, want := consistenthash.FNV1a(s), h.Sum64(); got != want {
			t.Fatalf("fnv1a(%q) = %#x, hash/fnv says %#x", s, got, want)
		}
	}
}

func TestKeysSpreadEvenly(t *testing.T) {
	const n, nkeys = 10, 10000
	b := build(t, consistenthash.DefaultOptions())
	s := numbered(n)
	b.Update(s)
	count := map[string]int{}
	for _, id := range owners(t, b, s, keys(nkeys)) {
		count[id]++
	}
	for _, in := range s {
		share := float64(count[in.ID]) / nkeys
		if share < 0.5/n || share > 1.5/n {
			t.Errorf("instance %s owns %.3f of the keys; want within [%.3f, %.3f] of %d instances with 160 replicas", in.ID, share, 0.5/n, 1.5/n, n)
		}
	}
}

func TestOneInstanceMoreOrLessMovesAboutOneNthOfTheKeys(t *testing.T) {
	const n, nkeys = 10, 10000
	ks := keys(nkeys)
	all := numbered(n + 1)
	b := build(t, consistenthash.DefaultOptions())
	ten := slices.Clone(all[:n])
	b.Update(ten)
	before := owners(t, b, ten, ks)

	t.Run("removing one", func(t *testing.T) {
		removed := ten[3].ID
		nine := slices.Delete(slices.Clone(ten), 3, 4)
		b.Update(nine)
		after := owners(t, b, nine, ks)
		moved := 0
		for _, k := range ks {
			if before[k] != after[k] {
				moved++
				if before[k] != removed {
					t.Fatalf("key %q moved from %s to %s, though only %s was removed", k, before[k], after[k], removed)
				}
			}
			if before[k] == removed && after[k] == removed {
				t.Fatalf("key %q still goes to removed instance %s", k, removed)
			}
		}
		checkMoved(t, moved, nkeys, n)
	})
	t.Run("adding one", func(t *testing.T) {
		added := all[n].ID
		eleven := slices.Clone(all)
		b.Update(eleven)
		after := owners(t, b, eleven, ks)
		moved := 0
		for _, k := range ks {
			if before[k] != after[k] {
				moved++
				if after[k] != added {
					t.Fatalf("key %q moved from %s to %s, though only %s was added", k, before[k], after[k], added)
				}
			}
		}
		checkMoved(t, moved, nkeys, n+1)
	})
}

func checkMoved(t *testing.T, moved, nkeys, n int) {
	t.Helper()
	frac := float64(moved) / float64(nkeys)
	t.Logf("%d of %d keys moved (%.3f; 1/N = %.3f)", moved, nkeys, frac, 1/float64(n))
	if frac < 0.5/float64(n) || frac > 2/float64(n) {
		t.Errorf("%.3f of the keys moved; want about 1/%d, within [%.3f, %.3f]", frac, n, 0.5/float64(n), 2/float64(n))
	}
}

func TestCallWithoutTheKey(t *testing.T) {
	cases := []struct {
		name string
		info *kernel.CallInfo
	}{
		{"no metadata", &kernel.CallInfo{Method: "Echo.Say"}},
		{"other entries only", &kernel.CallInfo{Method: "Echo.Say", Metadata: kernel.Metadata{"tenant": "t1", "X-Hash-Key": "k"}}},
		{"empty value", &kernel.CallInfo{Method: "Echo.Say", Metadata: kernel.Metadata{"x-hash-key": ""}}},
		{"nil info", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := build(t, consistenthash.DefaultOptions())
			b.Update(numbered(3))
			p, err := b.Pick(context.Background(), tc.info)
			if p != nil || err == nil {
				t.Fatalf("Pick = %v, %v; want nil and an error", p, err)
			}
			if code := kernel.CodeOf(err); code != kernel.InvalidArgument {
				t.Errorf("error %q has code %s, want InvalidArgument", err, code)
			}
			if errors.Is(err, kernel.ErrNoInstances) {
				t.Errorf("error %q wraps ErrNoInstances: the client would wait for instances that would not help", err)
			}
			for _, want := range []string{`"x-hash-key"`, "fallback: random", "consistent-hash"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %s", err, want)
				}
			}
		})
	}
	t.Run("named by the key option", func(t *testing.T) {
		o := consistenthash.DefaultOptions()
		o.Key = "tenant"
		b := build(t, o)
		b.Update(numbered(3))
		_, err := b.Pick(context.Background(), keyed("k"))
		if err == nil || !strings.Contains(err.Error(), `"tenant"`) {
			t.Fatalf("Pick without the tenant entry = %v; want an error naming \"tenant\"", err)
		}
		if _, err := b.Pick(context.Background(), &kernel.CallInfo{Metadata: kernel.Metadata{"tenant": "t1"}}); err != nil {
			t.Fatalf("Pick with the tenant entry: %v", err)
		}
	})
	t.Run("before there are instances", func(t *testing.T) {
		_, err := build(t, consistenthash.DefaultOptions()).Pick(context.Background(), &kernel.CallInfo{})
		if kernel.CodeOf(err) != kernel.InvalidArgument {
			t.Fatalf("Pick without the key and without instances = %v; want InvalidArgument at once", err)
		}
	})
}

func TestFallbackRandomSpreadsKeylessCalls(t *testing.T) {
	o := consistenthash.DefaultOptions()
	o.Fallback = consistenthash.FallbackRandom
	b := build(t, o)
	s := numbered(4)
	b.Update(s)
	count := map[string]int{}
	for range 4000 {
		p, err := b.Pick(context.Background(), &kernel.CallInfo{Method: "Echo.Say"})
		if err != nil {
			t.Fatal(err)
		}
		count[p.ID]++
	}
	for _, in := range s {
		if c := count[in.ID]; c < 800 || c > 1200 {
			t.Errorf("instance %s got %d of 4000 keyless picks; want about 1000", in.ID, c)
		}
	}
	// A keyed call still hashes.
	ks := keys(100)
	if a, b2 := owners(t, b, s, ks), owners(t, b, s, ks); !mapsEqual(a, b2) {
		t.Errorf("with fallback random, keyed calls no longer go to the same instance")
	}
}

func TestNoInstances(t *testing.T) {
	for name, update := range map[string]func(*consistenthash.Balancer){
		"never updated":     func(*consistenthash.Balancer) {},
		"empty set":         func(b *consistenthash.Balancer) { b.Update([]kernel.Instance{}) },
		"empty after a set": func(b *consistenthash.Balancer) { b.Update(numbered(2)); b.Update(nil) },
	} {
		for _, fallback := range []string{consistenthash.FallbackError, consistenthash.FallbackRandom} {
			t.Run(name+"/"+fallback, func(t *testing.T) {
				o := consistenthash.DefaultOptions()
				o.Fallback = fallback
				b := build(t, o)
				update(b)
				p, err := b.Pick(context.Background(), keyed("k"))
				if p != nil || !errors.Is(err, kernel.ErrNoInstances) {
					t.Fatalf("Pick = %v, %v; want nil and an error wrapping kernel.ErrNoInstances", p, err)
				}
				if !strings.Contains(err.Error(), "Echo.Say") {
					t.Errorf("error %q does not name the method", err)
				}
			})
		}
	}
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		key     string
	}{
		{"empty key", map[string]any{"key": ""}, "key"},
		{"no replicas", map[string]any{"replicas": 0}, "replicas"},
		{"negative replicas", map[string]any{"replicas": -5}, "replicas"},
		{"too many replicas", map[string]any{"replicas": 10001}, "replicas"},
		{"unknown fallback", map[string]any{"fallback": "first"}, "fallback"},
		{"replicas of the wrong type", map[string]any{"replicas": "many"}, "replicas"},
		{"unknown option", map[string]any{"hash": "md5"}, "hash"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kernel.NewBalancer(consistenthash.Name, tc.options, "svc.yaml")
			if err == nil {
				t.Fatalf("NewBalancer with %v succeeded; want an error", tc.options)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("option %q", tc.key)) {
				t.Errorf("error %q does not name option %q", err, tc.key)
			}
		})
	}
}

func TestRegisteredUnderName(t *testing.T) {
	b, err := kernel.NewBalancer(consistenthash.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewBalancer(%q): %v", consistenthash.Name, err)
	}
	if _, ok := b.(*consistenthash.Balancer); !ok {
		t.Errorf("NewBalancer(%q) built a %T", consistenthash.Name, b)
	}
}

// Picks held across Updates point into the sets Update was given, which
// the balancer never writes.
func TestConcurrentPicksAndUpdates(t *testing.T) {
	b := build(t, consistenthash.DefaultOptions())
	sets := [][]kernel.Instance{numbered(1), numbered(3), numbered(8)}
	b.Update(sets[0])
	stop := make(chan struct{})
	var wg sync.WaitGroup
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
	for g := range 4 {
		pickers.Go(func() {
			for i := range 2000 {
				p, err := b.Pick(context.Background(), keyed(fmt.Sprint(g, "-", i)))
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				if !strings.HasPrefix(p.ID, "echo@10.0.0.") || p.Address != p.ID+".invalid:7000" {
					t.Errorf("Pick returned %+v, no instance of the sets given", *p)
					return
				}
			}
		})
	}
	pickers.Wait()
	close(stop)
	wg.Wait()
}

func TestPickDoesNotAllocate(t *testing.T) {
	b := build(t, consistenthash.DefaultOptions())
	b.Update(numbered(10))
	ctx, info := context.Background(), keyed("user-12345")
	if allocs := testing.AllocsPerRun(1000, func() { _, _ = b.Pick(ctx, info) }); allocs != 0 {
		t.Errorf("Pick: %.1f allocations per call, want 0", allocs)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprint(n, "instances"), func(b *testing.B) {
			bal := build(b, consistenthash.DefaultOptions())
			bal.Update(numbered(n))
			ctx, info := context.Background(), keyed("user-12345")
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := bal.Pick(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// Two instances listed under one ID at different addresses are two servers
// (Consul lists a service another program registered as "web" on each of
// its nodes under that one ID): each owns its share of the keys, and every
// client agrees which, whatever order its registry lists them in.
func TestInstancesSharingAnIDAtDifferentAddressesShareTheKeys(t *testing.T) {
	s := []kernel.Instance{
		{Service: "web", ID: "web", Address: "10.0.0.1:80"},
		{Service: "web", ID: "web", Address: "10.0.0.2:80"},
		{Service: "web", ID: "web", Address: "10.0.0.3:80"},
		{Service: "web", ID: "other", Address: "10.0.0.4:80"},
	}
	ks := keys(2000)
	byAddress := func(b kernel.Balancer, s []kernel.Instance) map[string]string {
		out := make(map[string]string, len(ks))
		for _, k := range ks {
			p, err := b.Pick(context.Background(), keyed(k))
			if err != nil {
				t.Fatalf("Pick for key %q: %v", k, err)
			}
			out[k] = p.Address
		}
		return out
	}
	b := build(t, consistenthash.DefaultOptions())
	b.Update(s)
	first := byAddress(b, s)
	count := map[string]int{}
	for _, a := range first {
		count[a]++
	}
	for _, in := range s {
		if n := count[in.Address]; n < 2000/len(s)/2 {
			t.Errorf("keys by address: %v; %s owns %d of 2000, want about a quarter", count, in.Address, n)
		}
	}
	for i := range 20 {
		shuffled := slices.Clone(s)
		r := rand.New(rand.NewPCG(uint64(i), 1))
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		other := build(t, consistenthash.DefaultOptions()) // another client
		other.Update(shuffled)
		if got := byAddress(other, shuffled); !mapsEqual(first, got) {
			order := make([]string, len(shuffled))
			for j, in := range shuffled {
				order[j] = in.ID + "@" + in.Address
			}
			t.Fatalf("a client given the same set in the order %v sends keys elsewhere", order)
		}
	}
}
